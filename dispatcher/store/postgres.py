"""PostgreSQL backend (psycopg 3): async, pooled, one statement per batch of status updates."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from shardq_common.clock import wall_ms
from shardq_common.errors import StoreUnavailable
from shardq_common.redaction import redact

from . import dependencies
from .base import (
    NEW_JOB_COLUMNS,
    AttemptUpdate,
    JobRow,
    Released,
    Store,
    StoreConflict,
    StoreUpdate,
    Tx,
    release_waiting,
)
from .partitions import PartitionQueries
from .search import COUNT_TIMEOUT_MS, SEARCH_TIMEOUT_MS, JobQuery, SearchTooSlow

# One statement for a whole batch of status updates (executemany would be a round trip per row);
# the same rules as base._UPDATE.
_UPDATE_MANY = (
    "UPDATE jobs SET status = v.status, run_at = COALESCE(v.run_at, jobs.run_at), "
    "lease_until = v.lease_until, "
    "attempts = COALESCE(v.attempts, jobs.attempts), failures = COALESCE(v.failures, jobs.failures), "
    "expirations = COALESCE(v.expirations, jobs.expirations), "
    "last_error = COALESCE(v.last_error, jobs.last_error), dead_reason = v.dead_reason, "
    "result = COALESCE(v.result, jobs.result), started_at = COALESCE(v.started_at, jobs.started_at), "
    "finished_at = v.finished_at, rate_limited = COALESCE(v.rate_limited, jobs.rate_limited), "
    "worker = COALESCE(v.worker, jobs.worker), updated_at = %s "
    # Binary parameters: psycopg dumps arrays with less CPU than as text.
    "FROM unnest(%b::text[], %b::text[], %b::bigint[], %b::bigint[], %b::int[], %b::int[], %b::int[], "
    "%b::text[], %b::text[], %b::bytea[], %b::bigint[], %b::bigint[], %b::int[], %b::text[]) "
    "AS v(id, status, run_at, lease_until, attempts, failures, expirations, last_error, dead_reason, result, "
    "started_at, finished_at, rate_limited, worker) "
    "WHERE jobs.id = v.id AND jobs.status NOT IN ('succeeded', 'cancelled', 'dead')"
)

# The attempt history of a batch in one statement too (the status writer sends each (job_id,
# attempt) once per batch, as ON CONFLICT DO UPDATE requires); the same rules as base._UPSERT_ATTEMPT.
_UPSERT_ATTEMPTS = (
    "INSERT INTO job_attempts (job_id, attempt, worker, started_at, finished_at, outcome, error, traceback) "
    "SELECT v.job_id, v.attempt, COALESCE(v.worker, j.worker), COALESCE(v.started_at, j.started_at), "
    "v.finished_at, v.outcome, v.error, v.traceback "
    "FROM unnest(%b::text[], %b::int[], %b::text[], %b::bigint[], %b::bigint[], %b::text[], %b::text[], "
    "%b::text[]) AS v(job_id, attempt, worker, started_at, finished_at, outcome, error, traceback) "
    "LEFT JOIN jobs j ON j.id = v.job_id ON CONFLICT (job_id, attempt) DO UPDATE SET "
    + ", ".join(
        f"{c} = COALESCE(excluded.{c}, job_attempts.{c})"
        for c in ("worker", "started_at", "finished_at", "outcome", "error", "traceback")
    )
)
_PROGRESS_MANY = (
    "UPDATE jobs SET progress = v.progress FROM unnest(%b::text[], %b::text[]) AS v(id, progress) "
    "WHERE jobs.id = v.id AND jobs.status NOT IN ('succeeded', 'cancelled', 'dead')"
)

# What shardq_enqueue_rows (migrations 0008, 0010) notifies, with the shard as payload, when its jobs commit.
ENQUEUED_CHANNEL = "shardq_enqueued"

# Binary COPY is the fastest way in, for the server and for the client's CPU; it cannot skip
# conflicts, so batches with idempotency keys take the INSERT.
_NEW_JOB_TYPES = (
    *("text", "text", "int4", "int2", "bytea", "text"),
    *("int8", "int4", "int4", "text", "int8", "int8", "text", "text"),
)
_COPY_NEW_JOBS = f"COPY jobs ({NEW_JOB_COLUMNS}) FROM STDIN (FORMAT BINARY)"
_INSERT_NEW_JOBS = (
    f"INSERT INTO jobs ({NEW_JOB_COLUMNS}) SELECT * FROM unnest("
    + ", ".join(f"%b::{t}[]" for t in _NEW_JOB_TYPES)
    + ") ON CONFLICT DO NOTHING"
)
_IDEM_KEY = 9  # its index in NEW_JOB_COLUMNS
# A few rows go as VALUES: the planner's work for unnest() of 14 typed arrays is about as much as the
# commit's on a fast disk, so single enqueues and the small groups concurrent ones share take this.
_VALUES_ROWS = 8
_ROW_MARKS = "(" + ", ".join(f"%s::{t}" for t in _NEW_JOB_TYPES) + ")"
_INSERT_VALUES = {
    n: f"INSERT INTO jobs ({NEW_JOB_COLUMNS}) VALUES {', '.join([_ROW_MARKS] * n)} ON CONFLICT DO NOTHING"
    for n in range(1, _VALUES_ROWS + 1)
}
# Up to this many new jobs (single enqueues, and the groups concurrent ones share) go as one INSERT
# committed on its own: one round trip, where a transaction around COPY takes several.
_ONE_STATEMENT_ROWS = 200
# pg_advisory_xact_lock key of migrations, one per database: b"shardq:m" read as a big-endian int64.
_SCHEMA_LOCK_KEY = int.from_bytes(b"shardq:m", "big", signed=True)


def _as_columns(rows: Sequence[Sequence[Any]]) -> list[list[Any]]:
    """NEW_JOB_COLUMNS rows as one array per column, for the unnest() of _INSERT_NEW_JOBS."""
    return [list(column) for column in zip(*rows, strict=True)]


def _pg(sql: str) -> str:
    return sql.replace("?", "%s")


class _PgTx(Tx):
    supports_for_update = True
    supports_array_params = True
    # Keys are unique across the partitions of jobs in a table of their own (migration 0014).
    idem_owners_sql = "SELECT idem_key, job_id FROM job_idem_keys WHERE type = ? AND idem_key IN ({marks})"

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        async with self.conn.cursor() as cur:
            if params:
                await cur.execute(_pg(sql), tuple(params))
            else:
                # Taken as it is: a statement without parameters has no placeholders to translate, and
                # a migration's function body has its own % and ? (RAISE formats, jsonb operators).
                await cur.execute(sql.encode())
            return list(await cur.fetchall()) if cur.description else []

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        if rows:
            async with self.conn.cursor() as cur:
                await cur.executemany(_pg(sql), rows)

    async def lock_schema(self) -> None:
        await self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK_KEY,))

    async def insert_new_jobs(self, rows: Sequence[Sequence[Any]]) -> None:
        if not rows:
            return
        if any(row[_IDEM_KEY] is not None for row in rows):
            await self.conn.execute(_INSERT_NEW_JOBS, _as_columns(rows))
            return
        async with self.conn.cursor() as cur, cur.copy(_COPY_NEW_JOBS) as copy:
            copy.set_types(list(_NEW_JOB_TYPES))
            for row in rows:
                await copy.write_row(row)


#: SQLSTATEs of a transaction the server aborted to resolve a conflict: deadlock, serialization.
_CONFLICTS = ("40P01", "40001")
_IDLE = psycopg.pq.TransactionStatus.IDLE
# As long as the pool waits for a connection.
_CONNECT_TIMEOUT_S = 5
# After the sessions connected again to leave a server refusing writes, they do not again before
# this long: sessions opened since that refuse writes too reach a server that is read-only itself
# (a disk-full guard, maintenance), and connecting again at every write would only churn.
_REACH_AGAIN_S = 5.0


def _read_only_error(exc: psycopg.errors.ReadOnlySqlTransaction) -> StoreUnavailable:
    return StoreUnavailable(f"the database refuses writes (a standby: a failover demoted it?): {exc}")


def _store_error(exc: psycopg.OperationalError) -> StoreConflict | StoreUnavailable:
    """A server that is gone or unreachable (a pool timeout too: an OperationalError) is an outage; a
    conflict is not."""
    if getattr(exc, "sqlstate", None) in _CONFLICTS:
        return StoreConflict(f"transaction aborted by a conflict with another: {exc}")
    return StoreUnavailable(f"database unavailable: {exc}")


class PostgresStore(PartitionQueries, Store):
    backend = "postgres"

    def __init__(self, url: str, min_size: int = 1, max_size: int = 8) -> None:
        self.url = url
        self.url_for_logs = redact(url)
        self.pool = AsyncConnectionPool(
            url, min_size=min_size, max_size=max_size, open=False, timeout=_CONNECT_TIMEOUT_S
        )
        # The connection kept open in autocommit for statements that commit alone (_execute_alone).
        self._kept: psycopg.AsyncConnection[Any] | None = None
        self._kept_lock = asyncio.Lock()
        self._kept_stale = False  # closed before its next statement (_reach_the_primary)
        self._reached_at: float | None = None  # when (monotonic s) _reach_the_primary last ran

    async def open(self) -> None:
        try:
            await self.pool.open(wait=True, timeout=10.0)
        except PoolTimeout as exc:
            raise StoreUnavailable(f"cannot connect to {self.url_for_logs}") from exc
        # Opened now, not at the first enqueue: connecting takes milliseconds that enqueue would wait.
        with suppress(psycopg.OperationalError):
            self._kept = await self._connect_kept()

    async def _connect_kept(self) -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(
            self.url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_S
        )

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection; a server that is gone or unreachable, or that refuses writes, is an
        outage."""
        conn: psycopg.AsyncConnection[Any] | None = None
        try:
            async with self.pool.connection() as conn:
                yield conn
        except psycopg.OperationalError as exc:  # a PoolTimeout is one
            if conn is not None and conn.broken:
                # The server may have restarted: the pool's idle sessions died with this one, and
                # each would fail a write of its own. Checked now, the dead are replaced.
                await self.pool.check()
            raise _store_error(exc) from exc
        except psycopg.errors.ReadOnlySqlTransaction as exc:
            await self._reach_the_primary()
            raise _read_only_error(exc) from exc

    async def _reach_the_primary(self) -> bool:
        """A server refused a write as read-only. Behind an address that follows the primary (DNS, a
        virtual IP, a proxy), a failover can leave connections on the old primary, now a standby: left
        in the pool, each would fail every write until it is recycled an hour later. Every connection
        connects again, through the URL, to whatever it reaches now: the pool's idle ones at once,
        those in use once their transaction ends (not cut mid-statement), the kept one before its
        next statement. Returns False, doing nothing, when they did so less than _REACH_AGAIN_S ago."""
        now = time.monotonic()
        if self._reached_at is not None and now - self._reached_at < _REACH_AGAIN_S:
            return False
        self._reached_at = now
        self._kept_stale = True
        await self.pool.drain()
        return True

    async def _execute_alone(self, statement: str, params: Sequence[Any]) -> None:
        """Run one statement as its own (durable) transaction, on a connection of its own kept open in
        autocommit: the group commit sends its inserts one after another, and a pooled connection's
        checkout and check-in, with autocommit switched on and off, is a share of a one-row insert's
        client CPU worth saving (docs/performance.md).

        The kept connection can have died since its last use (the server restarted, or a proxy cut
        it while idle): a statement that fails on it with a connection error is sent once more, on a
        new connection. So is one refused as read-only, unless the sessions connected again lately:
        the server it reached may be the old primary, a standby now (see _reach_the_primary). Only
        statements that may run twice come here: an insert of new ids, which skips ids present. A
        new connection waits at most _CONNECT_TIMEOUT_S, so an enqueue during an outage is refused
        within it."""
        async with self._kept_lock:
            for last_try in (False, True):
                if self._kept_stale:
                    self._kept_stale = False
                    await self._close_kept()
                reused = self._kept is not None
                try:
                    if self._kept is None:
                        self._kept = await self._connect_kept()
                    await self._kept.execute(statement, params)
                    return
                except psycopg.OperationalError as exc:
                    await self._close_kept()
                    if last_try or not reused:
                        raise _store_error(exc) from exc
                except psycopg.errors.ReadOnlySqlTransaction as exc:
                    if last_try or not await self._reach_the_primary():
                        raise _read_only_error(exc) from exc
                finally:
                    # A cancelled statement can leave it mid-query: a new one serves the next.
                    if self._kept is not None and self._kept.info.transaction_status != _IDLE:
                        await self._close_kept()

    async def _close_kept(self) -> None:
        conn, self._kept = self._kept, None
        if conn is not None:
            with suppress(psycopg.Error):
                await conn.close()

    @asynccontextmanager
    async def transaction(self, *, durable: bool = True) -> AsyncIterator[Tx]:
        async with self._connection() as conn, conn.transaction():
            if not durable:
                await conn.execute("SET LOCAL synchronous_commit = off")
            yield _PgTx(conn)

    @asynccontextmanager
    async def search_transaction(self) -> AsyncIterator[Tx]:
        try:
            async with self._connection() as conn, conn.transaction():
                await conn.execute(f"SET LOCAL statement_timeout = {SEARCH_TIMEOUT_MS}")
                yield _PgTx(conn)
        except StoreUnavailable as exc:
            if isinstance(exc.__cause__, psycopg.errors.QueryCanceled):
                raise SearchTooSlow(
                    f"the search ran over {SEARCH_TIMEOUT_MS // 1000} s and was stopped: narrow it "
                    "(a job type, a state, a time range)"
                ) from None
            raise

    async def count_jobs(self, query: JobQuery) -> tuple[int, bool]:
        """Exact when counting takes under COUNT_TIMEOUT_MS; else the planner's estimate."""
        if query.matches_nothing():
            return 0, True
        where, params = query.where(self.backend)
        async with self._connection() as conn, conn.transaction():
            await conn.execute(f"SET LOCAL statement_timeout = {COUNT_TIMEOUT_MS}")
            try:
                async with conn.transaction():  # a savepoint: the cancelled count leaves the rest usable
                    cur = await conn.execute(_pg(f"SELECT COUNT(*) FROM jobs WHERE {where}"), params)
                    row = await cur.fetchone()
                    return (int(row[0]) if row else 0), True
            except psycopg.errors.QueryCanceled:
                pass
            await conn.execute(f"SET LOCAL statement_timeout = {SEARCH_TIMEOUT_MS}")
            cur = await conn.execute(_pg(f"EXPLAIN (FORMAT JSON) SELECT 1 FROM jobs WHERE {where}"), params)
            plan = await cur.fetchone()
        return (int(plan[0][0]["Plan"]["Plan Rows"]) if plan else 0), False

    async def insert_jobs(self, rows: Sequence[JobRow]) -> list[tuple[str, bool]]:
        if len(rows) > _ONE_STATEMENT_ROWS or any(r.idem_key for r in rows):
            return await super().insert_jobs(rows)
        if len(rows) <= _VALUES_ROWS:
            await self._execute_alone(
                _INSERT_VALUES[len(rows)], [v for r in rows for v in r.new_job_values()]
            )
        else:
            await self._execute_alone(_INSERT_NEW_JOBS, _as_columns([r.new_job_values() for r in rows]))
        return [(r.id, True) for r in rows]

    async def apply_updates(
        self,
        updates: Iterable[StoreUpdate],
        attempts: Sequence[AttemptUpdate] = (),
        progress: Sequence[tuple[str, str]] = (),
    ) -> None:
        rows = list(updates)
        if not rows and not attempts and not progress:
            return
        columns = [
            [u.id for u in rows],
            [u.status for u in rows],
            [u.run_at for u in rows],
            [u.lease_until for u in rows],
            [u.attempts for u in rows],
            [u.failures for u in rows],
            [u.expirations for u in rows],
            [u.last_error for u in rows],
            [u.dead_reason for u in rows],
            [u.result for u in rows],
            [u.started_at for u in rows],
            [u.finished_at for u in rows],
            [u.rate_limited for u in rows],
            [u.worker for u in rows],
        ]

        async def write(tx: Tx) -> tuple[None, Released]:
            if attempts:
                by_column = [list(c) for c in zip(*(a.values() for a in attempts), strict=True)]
                await tx.execute(_UPSERT_ATTEMPTS, by_column)
            if progress:
                await tx.execute(_PROGRESS_MANY, [[p[0] for p in progress], [p[1] for p in progress]])
            if not rows:
                return None, ([], [])
            now = wall_ms()
            await tx.execute(_UPDATE_MANY, [now, *columns])
            # Issue 21: as base.Store.apply_updates, in the transaction that records the ends.
            return None, await release_waiting(
                tx, [u.id for u in rows if u.status in dependencies.TERMINAL], now
            )

        await self._resolving(write, durable=False)

    supports_sql_enqueue = True

    async def listen_enqueued(
        self, on_shard: Callable[[int], None], on_listening: Callable[[], None]
    ) -> None:
        # A connection of its own, outside the pool: LISTEN holds it for as long as it lives.
        try:
            conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True, connect_timeout=10)
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"database unavailable: {exc}") from exc
        try:
            async with conn:
                await conn.execute(f"LISTEN {ENQUEUED_CHANNEL}")
                on_listening()
                async for note in conn.notifies():
                    if note.payload.isdigit():
                        on_shard(int(note.payload))
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"listening for SQL enqueues: {exc}") from exc

    async def shards_to_push(self) -> list[int]:
        async with self.transaction() as tx:
            # A loose index scan: one probe of jobs_to_push_shard per shard that has jobs in it.
            rows = await tx.execute(
                "WITH RECURSIVE s AS ("
                "(SELECT shard FROM jobs_to_push ORDER BY shard LIMIT 1) UNION ALL "
                "SELECT (SELECT shard FROM jobs_to_push WHERE shard > s.shard ORDER BY shard LIMIT 1) "
                "FROM s WHERE s.shard IS NOT NULL) SELECT shard FROM s WHERE shard IS NOT NULL"
            )
        return [int(r[0]) for r in rows]

    async def ids_to_push(self, shard: int, limit: int) -> list[str]:
        async with self.transaction() as tx:
            rows = await tx.execute(
                "SELECT id FROM jobs_to_push WHERE shard = ? ORDER BY id LIMIT ?", (shard, limit)
            )
        return [r[0] for r in rows]

    async def forget_to_push(self, ids: Sequence[str]) -> None:
        # Not durable: a note lost in a crash makes its job pushed again, and the push skips a job
        # Redis holds (and the reader a job whose row has finished).
        async with self.transaction(durable=False) as tx:
            await tx.execute("DELETE FROM jobs_to_push WHERE id = ANY(?)", (list(ids),))

    async def awaiting_push(self, ids: Sequence[str]) -> set[str]:
        async with self.transaction() as tx:
            rows = await tx.execute("SELECT id FROM jobs_to_push WHERE id = ANY(?)", (list(ids),))
        return {r[0] for r in rows}

    async def write_position(self) -> int:
        return await self._lsn("pg_current_wal_insert_lsn()")

    async def durable_position(self) -> int:
        return await self._lsn("pg_current_wal_flush_lsn()")

    async def _lsn(self, function: str) -> int:
        async with self._connection() as conn:
            row = await (await conn.execute(f"SELECT pg_wal_lsn_diff({function}, '0/0')::bigint")).fetchone()
        return int(row[0]) if row else 0

    async def close(self) -> None:
        async with self._kept_lock:
            await self._close_kept()
        await self.pool.close()
