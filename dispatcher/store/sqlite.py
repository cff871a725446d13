"""SQLite backend, the embedded default: one connection in its own thread, WAL, durable commits."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiosqlite

from shardq_common.errors import StoreUnavailable

from .base import Store, Tx

_INCREMENTAL = 2  # PRAGMA auto_vacuum's value for INCREMENTAL
#: Most free pages one incremental vacuum gives back (16 MiB of 4 KiB pages).
VACUUM_PAGES = 4096


class _SqliteTx(Tx):
    def __init__(self, conn: aiosqlite.Connection) -> None:
        self.conn = conn

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        async with self.conn.execute(sql, tuple(params)) as cur:
            return [tuple(r) for r in await cur.fetchall()]

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        await self.conn.executemany(sql, rows)


class SqliteStore(Store):
    backend = "sqlite"

    def __init__(self, path: str) -> None:
        self.path = path
        self.url_for_logs = f"sqlite:///{path}"
        self._conn: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()  # one transaction at a time on the one connection
        self._durable = True

    async def open(self) -> None:
        if self.path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        # isolation_level=None: we issue BEGIN IMMEDIATE / COMMIT ourselves.
        self._conn = await aiosqlite.connect(self.path, isolation_level=None, timeout=10)
        try:
            await self._incremental_vacuum_if_new()
            await self._enable_wal()
            # FULL: a commit is on disk before enqueue returns OK.
            await self._conn.execute("PRAGMA synchronous=FULL")
            await self._conn.execute("PRAGMA busy_timeout=10000")
        except sqlite3.Error as exc:
            # Closed, or its thread would keep the process from exiting.
            await self._conn.close()
            self._conn = None
            raise StoreUnavailable(f"cannot open {self.url_for_logs}: {exc}") from exc

    async def _incremental_vacuum_if_new(self) -> None:
        """A new file is made with auto_vacuum=INCREMENTAL, so that the pages retention frees can be
        given back (vacuum_some). The mode can only be chosen before the first table: a file made
        before it keeps its mode until a full VACUUM rewrites it (docs/operations.md)."""
        assert self._conn is not None
        async with self._conn.execute("SELECT count(*) FROM sqlite_master") as cur:
            row = await cur.fetchone()
        if row is not None and row[0] == 0:
            await self._conn.execute("PRAGMA auto_vacuum=INCREMENTAL")

    async def _pragma(self, name: str) -> int:
        assert self._conn is not None
        async with self._conn.execute(f"PRAGMA {name}") as cur:
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def vacuum_some(self) -> int:
        """Give up to VACUUM_PAGES free pages back once more than a tenth of the file is free: each
        page freed is a write under the one write lock, so a bounded number per call."""
        if self._conn is None or await self._pragma("auto_vacuum") != _INCREMENTAL:
            return 0
        free = await self._pragma("freelist_count")
        if free * 10 <= await self._pragma("page_count"):
            return 0
        pages = min(free, VACUUM_PAGES)
        async with self._lock:
            await self._conn.execute(f"PRAGMA incremental_vacuum({pages})")
        return pages

    async def table_bytes(self) -> dict[str, int]:
        """The file's size, and the jobs table's with its indexes when SQLite has its dbstat table."""
        if self._conn is None:
            return {}
        out = {"file": await self._pragma("page_count") * await self._pragma("page_size")}
        try:
            async with self._conn.execute(
                "SELECT sum(pgsize) FROM dbstat WHERE name = 'jobs' OR name IN "
                "(SELECT name FROM sqlite_master WHERE tbl_name = 'jobs' AND type = 'index')"
            ) as cur:
                row = await cur.fetchone()
            out["jobs"] = int(row[0] or 0) if row else 0
        except sqlite3.OperationalError:  # built without SQLITE_ENABLE_DBSTAT_VTAB
            pass
        return out

    async def _enable_wal(self, attempts: int = 50) -> None:
        """Switching a new file to WAL needs a lock SQLite does not wait for: the processes of one
        supervisor opening a new file together see "database is locked" and try again."""
        assert self._conn is not None
        for attempt in range(attempts):
            try:
                await self._conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or attempt == attempts - 1:
                    raise
                await asyncio.sleep(0.1)

    @asynccontextmanager
    async def transaction(self, *, durable: bool = True) -> AsyncIterator[Tx]:
        if self._conn is None:
            raise StoreUnavailable("the SQLite store is closed")
        async with self._lock:
            begin = asyncio.ensure_future(self._begin(durable))
            try:
                await asyncio.shield(begin)
            except asyncio.CancelledError:
                # The caller is gone, but its BEGIN goes on in the connection's thread (waiting for
                # the write lock): undo it once it is done, before the next caller uses the connection,
                # so no transaction is left open holding the lock for every process.
                await asyncio.shield(self._undo(begin))
                raise
            try:
                yield _SqliteTx(self._conn)
            except sqlite3.OperationalError as exc:  # locked, I/O error: an outage, not bad data
                await self._conn.execute("ROLLBACK")
                raise StoreUnavailable(f"database unavailable: {exc}") from exc
            except BaseException:
                await self._conn.execute("ROLLBACK")
                raise
            try:
                await self._conn.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                await self._conn.execute("ROLLBACK")
                raise StoreUnavailable(f"database unavailable: {exc}") from exc

    async def _undo(self, begin: asyncio.Future[None]) -> None:
        assert self._conn is not None
        try:
            await begin
        except Exception:
            return  # it did not start a transaction
        await self._conn.execute("ROLLBACK")

    async def _begin(self, durable: bool) -> None:
        assert self._conn is not None
        for attempt in range(2):
            try:
                if durable != self._durable:
                    # WAL with NORMAL: the commit survives a process crash; only a power loss can undo it.
                    await self._conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
                    self._durable = durable
                await self._conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                # A caller cancelled while its BEGIN or COMMIT waited for the lock leaves the statement
                # running in the connection's thread, and then a transaction nobody owns: undo it.
                if attempt == 0 and "transaction" in str(exc):
                    await self._conn.execute("ROLLBACK")
                    continue
                raise StoreUnavailable(f"database unavailable: {exc}") from exc

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
