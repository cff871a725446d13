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
            await self._enable_wal()
            # FULL: a commit is on disk before enqueue returns OK.
            await self._conn.execute("PRAGMA synchronous=FULL")
            await self._conn.execute("PRAGMA busy_timeout=10000")
        except sqlite3.Error as exc:
            # Closed, or its thread would keep the process from exiting.
            await self._conn.close()
            self._conn = None
            raise StoreUnavailable(f"cannot open {self.url_for_logs}: {exc}") from exc

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

    async def jobs_table_bytes(self) -> int:
        # The pages in use of the whole file (the dbstat table that would give the jobs table's own
        # is not in every build): the jobs table and its indexes are nearly all of it.
        async with self.transaction() as tx:
            pages = await tx.execute("PRAGMA page_count")
            free = await tx.execute("PRAGMA freelist_count")
            size = await tx.execute("PRAGMA page_size")
        return (int(pages[0][0]) - int(free[0][0])) * int(size[0][0])

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
