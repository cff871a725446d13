"""PostgreSQL backend (psycopg 3): async, pooled, pipelined executemany, bundled libpq."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ..errors import StoreUnavailable
from .base import Store, Tx


def _pg(sql: str) -> str:
    return sql.replace("?", "%s")


class _PgTx(Tx):
    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        async with self.conn.cursor() as cur:
            await cur.execute(_pg(sql), tuple(params))
            return list(await cur.fetchall()) if cur.description else []

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        if rows:
            async with self.conn.cursor() as cur:
                await cur.executemany(_pg(sql), rows)


class PostgresStore(Store):
    def __init__(self, url: str, min_size: int = 1, max_size: int = 8) -> None:
        self.url = url
        self.url_for_logs = redact(url)
        self.pool = AsyncConnectionPool(url, min_size=min_size, max_size=max_size, open=False, timeout=5.0)

    async def open(self) -> None:
        try:
            await self.pool.open(wait=True, timeout=10.0)
        except PoolTimeout as exc:
            raise StoreUnavailable(f"cannot connect to {self.url_for_logs}") from exc

    @asynccontextmanager
    async def transaction(self, *, durable: bool = True) -> AsyncIterator[Tx]:
        try:
            async with self.pool.connection() as conn, conn.transaction():
                if not durable:
                    await conn.execute("SET LOCAL synchronous_commit = off")
                yield _PgTx(conn)
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise StoreUnavailable(f"database unavailable: {exc}") from exc

    async def close(self) -> None:
        await self.pool.close()


def redact(url: str) -> str:
    """The URL without its password, for logs (also for multi-host URLs such as Redis Cluster seeds)."""
    return re.sub(r"^([a-z0-9+.-]+://[^:/@]*):[^@/]*@", r"\1:***@", url, flags=re.I)
