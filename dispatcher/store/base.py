"""SQL shared by both backends. Placeholders are written as ``?``; adapters translate them."""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypeVar

from shardq_common.clock import wall_ms
from shardq_common.errors import ConfigError, StoreUnavailable

from . import dependencies
from .dependencies import Edge
from .leftovers import LeftoverQueries
from .queue_settings import QueueSettingsQueries
from .retention import RetentionQueries, delete_attempts
from .schedules import ScheduleQueries
from .search import JobQuery, SearchPosition, SearchQueries

COLUMNS = (
    "id, type, shard, priority, payload, status, run_at, lease_until, attempts, failures, expirations, "
    "max_attempts, lease_ttl_ms, idem_key, last_error, dead_reason, result, enqueued_at, started_at, "
    "finished_at, updated_at, schedule, concurrency_key, rate_limited, headers, progress, worker"
)
ACTIVE_STATES = ("delayed", "ready", "leased")


@dataclass(slots=True)  # not frozen: made per job, see working_set.NewJob
class JobRow:
    id: str
    type: str
    shard: int
    priority: int
    payload: bytes
    status: str
    run_at: int
    lease_until: int | None
    attempts: int
    failures: int
    expirations: int
    max_attempts: int
    lease_ttl_ms: int
    idem_key: str | None
    last_error: str | None
    dead_reason: str | None
    result: bytes | None
    enqueued_at: int
    started_at: int | None
    finished_at: int | None
    updated_at: int
    schedule: str | None = None  # the schedule that materialized it
    concurrency_key: str | None = None  # its type's per-key limits go by it (None: none)
    rate_limited: int = 0  # retries its handler asked for by raising RateLimited (no attempt charged)
    headers: str | None = None  # JSON object of the job's headers (migration 0009); None: none
    progress: str | None = None  # JSON of its latest progress report (migration 0012); None: none
    worker: str | None = None  # the worker of its latest lease (migration 0012)
    #: Its dependencies not finished yet (migration 0016; not in COLUMNS: only inserts set it here).
    deps_remaining: int = 0

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> JobRow:
        values = list(row)
        values[4] = bytes(values[4])
        if values[16] is not None:
            values[16] = bytes(values[16])
        return cls(*values)

    def new_job_values(self) -> tuple[Any, ...]:
        """The row's NEW_JOB_COLUMNS, in their order."""
        return (
            self.id,
            self.type,
            self.shard,
            self.priority,
            self.payload,
            self.status,
            self.run_at,
            self.max_attempts,
            self.lease_ttl_ms,
            self.idem_key,
            self.enqueued_at,
            self.updated_at,
            self.concurrency_key,
            self.headers,
        )


@dataclass(slots=True)  # not frozen: made per job, see working_set.NewJob
class StoreUpdate:
    """A job's new status. None means "leave the column as it is" for the COALESCEd columns."""

    id: str
    status: str
    run_at: int | None = None
    lease_until: int | None = None
    attempts: int | None = None
    failures: int | None = None
    expirations: int | None = None
    last_error: str | None = None
    dead_reason: str | None = None
    result: bytes | None = None
    started_at: int | None = None
    finished_at: int | None = None
    rate_limited: int | None = None
    worker: str | None = None  # set by a lease: the worker of the job's latest run

    def merged_over(self, older: StoreUpdate) -> StoreUpdate:
        """This (newer) update, keeping the older one's values where this leaves a column unchanged
        (lease_until, dead_reason and finished_at always take the newer value)."""
        return StoreUpdate(
            self.id,
            self.status,
            older.run_at if self.run_at is None else self.run_at,
            self.lease_until,
            older.attempts if self.attempts is None else self.attempts,
            older.failures if self.failures is None else self.failures,
            older.expirations if self.expirations is None else self.expirations,
            older.last_error if self.last_error is None else self.last_error,
            self.dead_reason,
            older.result if self.result is None else self.result,
            older.started_at if self.started_at is None else self.started_at,
            self.finished_at,
            older.rate_limited if self.rate_limited is None else self.rate_limited,
            older.worker if self.worker is None else self.worker,
        )


#: What an attempt's outcome column holds (NULL while the run goes on).
ATTEMPT_OUTCOMES = ("succeeded", "failed", "lease_expired", "cancelled", "rate_limited")


@dataclass(slots=True)
class AttemptUpdate:
    """One run of a job (job_attempts, migration 0012): its start (worker, started_at), its end
    (finished_at, outcome, error, traceback), or both. None leaves a column as it is, so the start
    and the end may be written by different batches, or processes, in either order."""

    job_id: str
    attempt: int
    worker: str | None = None
    started_at: int | None = None
    finished_at: int | None = None
    outcome: str | None = None
    error: str | None = None
    traceback: str | None = None

    def merged_over(self, older: AttemptUpdate) -> AttemptUpdate:
        return AttemptUpdate(
            self.job_id,
            self.attempt,
            *(
                older_value if value is None else value
                for value, older_value in (
                    (self.worker, older.worker),
                    (self.started_at, older.started_at),
                    (self.finished_at, older.finished_at),
                    (self.outcome, older.outcome),
                    (self.error, older.error),
                    (self.traceback, older.traceback),
                )
            ),
        )

    def values(self) -> tuple[Any, ...]:
        return (
            self.job_id,
            self.attempt,
            self.worker,
            self.started_at,
            self.finished_at,
            self.outcome,
            self.error,
            self.traceback,
        )


@dataclass(frozen=True)
class AttemptRow:
    attempt: int
    worker: str | None
    started_at: int | None
    finished_at: int | None
    outcome: str | None
    error: str | None
    traceback: str | None


# A run whose start the batch does not carry (its lease's row update was committed before) takes it
# from the job's row, which holds its latest run's start until the batch's own updates (run after
# this statement) replace it.
_UPSERT_ATTEMPT = (
    "INSERT INTO job_attempts (job_id, attempt, worker, started_at, finished_at, outcome, error, traceback) "
    "SELECT ?, ?, COALESCE(?, (SELECT worker FROM jobs WHERE id = ?)), "
    "COALESCE(?, (SELECT started_at FROM jobs WHERE id = ?)), ?, ?, ?, ? "
    # WHERE true: SQLite reads ON CONFLICT after a bare SELECT as a join's constraint
    "WHERE true ON CONFLICT (job_id, attempt) DO UPDATE SET "
    + ", ".join(
        f"{c} = COALESCE(excluded.{c}, job_attempts.{c})"
        for c in ("worker", "started_at", "finished_at", "outcome", "error", "traceback")
    )
)
#: The most attempts GetJob lists (the latest ones): a job rate limited many times has many runs.
MAX_ATTEMPTS_LISTED = 100


@dataclass(frozen=True)
class DeadFilter:
    type: str = ""
    reason: str = ""
    #: Only these types (a caller's scope made exact); None: any type.
    types: tuple[str, ...] | None = None

    def where(self) -> tuple[str, list[Any]]:
        sql, params = "status = 'dead'", []
        if self.type:
            sql += " AND type = ?"
            params.append(self.type)
        if self.types is not None:
            sql += f" AND type IN ({', '.join('?' * len(self.types))})" if self.types else " AND 1 = 0"
            params.extend(self.types)
        if self.reason:
            sql += " AND dead_reason = ?"
            params.append(self.reason)
        return sql, params


class Tx(abc.ABC):
    """One open transaction."""

    supports_for_update = False  # SELECT ... FOR UPDATE (SQLite serializes writers anyway)
    #: ``= ANY(?)`` takes a list as one array parameter (PostgreSQL): one parameter for many ids
    supports_array_params = False
    #: (idem_key, id) of the jobs of a type (the first parameter) holding these keys (the others)
    idem_owners_sql = "SELECT idem_key, id FROM jobs WHERE type = ? AND idem_key IN ({marks})"

    @abc.abstractmethod
    async def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    @abc.abstractmethod
    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None: ...

    async def insert_new_jobs(self, rows: Sequence[Sequence[Any]]) -> None:
        """Insert NEW_JOB_COLUMNS rows; a row whose idempotency key exists in its type is skipped."""
        await self.executemany(_INSERT, rows)

    async def lock_schema(self) -> None:  # noqa: B027 - a no-op unless the store needs one
        """Hold other processes' migrations off until this transaction ends. SQLite's write
        transaction (BEGIN IMMEDIATE) already excludes every other writer."""


_KEY_RETRIES = 3


async def _owners_of_keys(tx: Tx, keys: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """(job type, idempotency key) -> the id of the job that holds the key within its type, for the
    keys that are held."""
    by_type: dict[str, list[str]] = {}
    for job_type, key in sorted(keys):
        by_type.setdefault(job_type, []).append(key)
    owner_of: dict[tuple[str, str], str] = {}
    for job_type, type_keys in by_type.items():
        for i in range(0, len(type_keys), 500):
            chunk = type_keys[i : i + 500]
            marks = ", ".join("?" * len(chunk))
            found = await tx.execute(tx.idem_owners_sql.format(marks=marks), [job_type, *chunk])
            owner_of.update({(job_type, k): v for k, v in found})
    return owner_of


_UPDATE = (
    "UPDATE jobs SET status = ?, run_at = COALESCE(?, run_at), lease_until = ?, "
    "attempts = COALESCE(?, attempts), failures = COALESCE(?, failures), "
    "expirations = COALESCE(?, expirations), last_error = COALESCE(?, last_error), dead_reason = ?, "
    "result = COALESCE(?, result), started_at = COALESCE(?, started_at), finished_at = ?, "
    "rate_limited = COALESCE(?, rate_limited), worker = COALESCE(?, worker), updated_at = ? "
    # A finished job stays finished: an older update committed late (by the shard's former owner)
    # must not make it look active again. Only a requeue (requeue_dead) leaves the dead state.
    "WHERE id = ? AND status NOT IN ('succeeded', 'cancelled', 'dead')"
)
NEW_JOB_COLUMNS = (
    "id, type, shard, priority, payload, status, run_at, max_attempts, lease_ttl_ms, idem_key, "
    "enqueued_at, updated_at, concurrency_key, headers"
)
_INSERT = (
    f"INSERT INTO jobs ({NEW_JOB_COLUMNS}) VALUES ({', '.join('?' * len(NEW_JOB_COLUMNS.split(',')))}) "
    "ON CONFLICT DO NOTHING"
)


async def _insert_rows(tx: Tx, rows: Sequence[JobRow]) -> list[tuple[str, bool]]:
    """Insert NEW_JOB_COLUMNS rows. Returns (id, created) in order: a job
    whose idempotency key exists in its type gets the existing job's id and created=False."""
    await tx.insert_new_jobs([r.new_job_values() for r in rows])
    owner_of = await _owners_of_keys(tx, {(r.type, r.idem_key) for r in rows if r.idem_key})
    # The job that held a key when the insert skipped ours can be deleted (a purge of dead
    # jobs) before the lookup: the key is free again, so ours goes in now. Resolved before
    # the commit, so that nothing fails once the jobs are committed.
    tries = 0
    while vanished := [r for r in rows if r.idem_key and (r.type, r.idem_key) not in owner_of]:
        tries += 1
        if tries > _KEY_RETRIES:  # rolled back: nothing is committed behind this error
            raise StoreUnavailable("idempotency keys changed hands during the enqueue; try again")
        await tx.insert_new_jobs([r.new_job_values() for r in vanished])
        owner_of.update(await _owners_of_keys(tx, {(r.type, r.idem_key) for r in vanished}))
    out = []
    for r in rows:
        if r.idem_key:
            existing = owner_of[(r.type, r.idem_key)]
            out.append((existing, existing == r.id))
        else:
            out.append((r.id, True))
    return out


async def rows_of(tx: Tx, ids: Sequence[str]) -> list[JobRow]:
    out = []
    for i in range(0, len(ids), 500):
        chunk = list(ids[i : i + 500])
        rows = await tx.execute(
            f"SELECT {COLUMNS} FROM jobs WHERE id IN ({', '.join('?' * len(chunk))})", chunk
        )
        out += [JobRow.from_row(r) for r in rows]
    return out


async def release_waiting(
    tx: Tx, finished: Iterable[str], now: int | None = None
) -> tuple[list[JobRow], list[str]]:
    """Resolve the edges of these jobs that are finished now (dependencies.resolve), in the
    transaction that records their ends. Returns the rows of the jobs it released (to push) and the
    ids of the ones it cancelled, for ``Store._resolved`` once the transaction has committed."""
    resolution = await dependencies.resolve(tx, finished, now)
    return await rows_of(tx, resolution.promoted), resolution.cancelled


class StoreConflict(StoreUnavailable):
    """The DB aborted the transaction to break a deadlock with another one (PostgreSQL's deadlock
    victim, or a serialization failure): it committed nothing, and it can run again."""


T = TypeVar("T")
#: What a transaction released out of 'waiting' (the rows, to push) and cancelled (the ids).
Released = tuple[list[JobRow], list[str]]

#: How many times a transaction that can lose a deadlock runs before StoreConflict reaches the caller.
CONFLICT_ATTEMPTS = 3


class Store(ScheduleQueries, QueueSettingsQueries, RetentionQueries, LeftoverQueries, SearchQueries, abc.ABC):
    """Job rows and shard epochs. Every method is one transaction."""

    url_for_logs: str = ""
    #: Told, after the commit, of the jobs a transaction moved out of 'waiting' (issue 21): their
    #: rows, to push to Redis; and of the waiting jobs it cancelled (ids). Set by the composition root.
    on_resolved: Callable[[list[JobRow], list[str]], None] | None = None
    #: migrations named ``NNNN_name.<backend>.sql`` run only on this backend; plain ``.sql`` on every one
    backend: str = ""

    @abc.abstractmethod
    def transaction(self, *, durable: bool = True) -> AbstractAsyncContextManager[Tx]:
        """A transaction. ``durable=False`` may return before the commit reaches the disk (a crash of
        the machine can lose the last such commits, never a durable one): status updates use it, since
        losing one can only make a job run again."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    async def _resolving(
        self, body: Callable[[Tx], Awaitable[tuple[T, Released]]], *, durable: bool = True
    ) -> T:
        """Run ``body`` in a transaction that may release or cancel waiting jobs, tell
        ``on_resolved`` what it released once it has committed, and return the rest of what it
        returned. Run again when the DB aborted it to break a deadlock: such transactions lock jobs
        along the graph (a cancel's cascade from the job it cancels, a status batch from the jobs it
        finished, an enqueue from the dependencies it names), so two of them can take the same rows
        in opposite orders; the second run finds the other one committed."""
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            try:
                async with self.transaction(durable=durable) as tx:
                    value, released = await body(tx)
                break
            except StoreConflict:
                if attempt == CONFLICT_ATTEMPTS:
                    raise
        self._resolved(*released)
        return value

    # -- schema --------------------------------------------------------------------

    async def migrate(self, before: str | None = None) -> list[str]:
        """Apply the migrations not applied yet, in order (only those numbered before ``before``,
        e.g. "0014", when given: a test's way to fill a table as an older version left it). Returns
        their names."""
        root = resources.files("dispatcher.store") / "migrations"
        names = sorted(
            p.name
            for p in root.iterdir()
            if _migration_for(p.name, self.backend) and (before is None or p.name < before)
        )
        applied: list[str] = []
        async with self.transaction() as tx:
            # Processes starting together (a supervisor's children, a Deployment's pods) take turns:
            # the first applies what is missing, the others then find it applied.
            await tx.lock_schema()
            await tx.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(version TEXT PRIMARY KEY, applied_at BIGINT NOT NULL)"
            )
            done = {r[0] for r in await tx.execute("SELECT version FROM schema_migrations")}
            for name in names:
                if name in done:
                    continue
                for statement in _statements((root / name).read_text()):
                    await tx.execute(statement)
                await tx.execute("INSERT INTO schema_migrations VALUES (?, ?)", (name, wall_ms()))
                applied.append(name)
        return applied

    async def ensure_shard_count(self, shard_count: int) -> int:
        """Record S when the cluster is created; a different S later is an error."""
        async with self.transaction() as tx:
            await tx.execute(
                "INSERT INTO cluster_meta (key, value) VALUES ('shard_count', ?) ON CONFLICT DO NOTHING",
                (str(shard_count),),
            )
            rows = await tx.execute("SELECT value FROM cluster_meta WHERE key = 'shard_count'")
        recorded = int(rows[0][0])
        if recorded != shard_count:
            raise ConfigError(
                f"this cluster was created with {recorded} shards; the dispatcher was started with "
                f"{shard_count} (set SHARDQ_SHARD_COUNT={recorded})"
            )
        return recorded

    async def record_enqueue_settings(self, settings: dict[str, int]) -> None:
        """Record the limits and defaults an enqueue applies (max_payload_bytes, max_attempts,
        lease_ttl_ms, max_batch), for the SQL enqueue functions (migration 0008), which read them
        from cluster_meta. Each dispatcher writes its own at its start: the last one started wins."""
        async with self.transaction() as tx:
            await tx.executemany(
                "INSERT INTO cluster_meta (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                [(key, str(value)) for key, value in sorted(settings.items())],
            )

    async def next_epochs(self, shards: Iterable[int], owner: str) -> dict[int, int]:
        out = {}
        async with self.transaction() as tx:
            for shard in shards:
                rows = await tx.execute(
                    "INSERT INTO shards (shard, epoch, owner, updated_at) VALUES (?, 1, ?, ?) "
                    "ON CONFLICT (shard) DO UPDATE SET epoch = shards.epoch + 1, owner = excluded.owner, "
                    "updated_at = excluded.updated_at RETURNING epoch",
                    (shard, owner, wall_ms()),
                )
                out[shard] = int(rows[0][0])
        return out

    # -- jobs ----------------------------------------------------------------------

    async def insert_jobs(self, rows: Sequence[JobRow]) -> list[tuple[str, bool]]:
        """Insert new jobs in one transaction. Returns (id, created) in order: a job whose
        idempotency key exists in its type gets the existing job's id and created=False."""
        async with self.transaction() as tx:
            return await _insert_rows(tx, rows)

    async def insert_graph(
        self,
        rows: Sequence[JobRow],
        edges: Sequence[Edge],
        may_use: Callable[[str], bool],
        name_of: Callable[[str], str],
        blocks: Sequence[Edge] = (),
    ) -> tuple[list[tuple[str, bool]], list[JobRow]]:
        """Insert jobs and their dependencies in one transaction (issue 21): all or nothing. An edge
        names the new row's id or an existing job's (``may_use`` decides which types the caller may
        depend on; an error names the job by ``name_of(id)``). Rows of jobs with edges must be
        'waiting' (their deps_remaining is counted here from the edges kept). Returns (id, created)
        per row, and the rows to push now:
        the created ones not waiting (those whose dependencies had all finished already go to
        ``on_resolved``).
        ``blocks``: edges from existing waiting jobs to new rows (dependencies.extend_waiting)."""
        new_ids = {r.id for r in rows}

        async def insert(tx: Tx) -> tuple[tuple[list[tuple[str, bool]], set[str], list[Edge]], Released]:
            await dependencies.check_dependencies(
                tx, sorted({e.depends_on_id for e in edges} - new_ids), may_use, name_of
            )
            results = await _insert_rows(tx, rows)
            actual = {r.id: job_id for r, (job_id, _) in zip(rows, results, strict=True)}
            created = {job_id for job_id, new in results if new}
            # A job whose idempotency key existed is not created: its edges are not either, and the
            # jobs of the batch that named it wait for the existing job instead.
            kept = dependencies.distinct_edges(
                Edge(e.job_id, actual.get(e.depends_on_id, e.depends_on_id), e.on_failure)
                for e in edges
                if e.job_id in created
            )
            await dependencies.insert_edges(tx, kept)
            # Counted from the edges kept: two dependencies of a job can turn out to be one job
            # (idempotency keys).
            await dependencies.count_edges(tx, kept)
            # Waiting jobs that get a new job as one more dependency (``blocks``: a batch grown
            # from inside), unless its idempotency key existed.
            await dependencies.extend_waiting(
                tx, [e for e in blocks if e.depends_on_id in created], may_use, name_of
            )
            # Dependencies finished before this commit resolve now, as if they had just finished.
            return (results, created, kept), await release_waiting(tx, {e.depends_on_id for e in kept})

        results, created, kept = await self._resolving(insert)
        waiting = {e.job_id for e in kept}
        # The waiting ones released at once (their dependencies had finished) go to on_resolved,
        # like every release: returned here too, they would be pushed twice.
        return results, [r for r in rows if r.id in created and r.id not in waiting]

    def _resolved(self, promoted: list[JobRow], cancelled: list[str]) -> None:
        if (promoted or cancelled) and self.on_resolved is not None:
            self.on_resolved(promoted, cancelled)

    async def apply_updates(
        self,
        updates: Iterable[StoreUpdate],
        attempts: Sequence[AttemptUpdate] = (),
        progress: Sequence[tuple[str, str]] = (),
    ) -> None:
        """Status updates, attempt history and progress reports ((job id, JSON)), in one transaction."""
        now = wall_ms()
        updates = list(updates)

        async def write(tx: Tx) -> tuple[None, Released]:
            if attempts:
                await tx.executemany(
                    _UPSERT_ATTEMPT,
                    [(a.job_id, a.attempt, a.worker, a.job_id, a.started_at, a.job_id, *a.values()[4:])
                     for a in attempts],
                )  # fmt: skip
            if progress:
                # A finished job's progress is final: a late report does not replace it.
                await tx.executemany(
                    "UPDATE jobs SET progress = ? WHERE id = ? "
                    "AND status NOT IN ('succeeded', 'cancelled', 'dead')",
                    [(json_text, job_id) for job_id, json_text in progress],
                )
            await tx.executemany(
                _UPDATE,
                [
                    (
                        u.status,
                        u.run_at,
                        u.lease_until,
                        u.attempts,
                        u.failures,
                        u.expirations,
                        u.last_error,
                        u.dead_reason,
                        u.result,
                        u.started_at,
                        u.finished_at,
                        u.rate_limited,
                        u.worker,
                        now,
                        u.id,
                    )
                    for u in updates
                ],
            )
            # Issue 21: the jobs this batch finished release the jobs waiting for them, here, in the
            # transaction that records their ends (store/dependencies.py).
            return None, await release_waiting(
                tx, [u.id for u in updates if u.status in dependencies.TERMINAL], now
            )

        await self._resolving(write, durable=False)

    async def get_job(self, job_id: str) -> JobRow | None:
        async with self.transaction() as tx:
            rows = await tx.execute(f"SELECT {COLUMNS} FROM jobs WHERE id = ?", (job_id,))
        return JobRow.from_row(rows[0]) if rows else None

    async def count_waiting(self) -> int:
        """Jobs waiting for their dependencies (the partial index jobs_waiting of migration 0016)."""
        async with self.transaction() as tx:
            rows = await tx.execute("SELECT COUNT(*) FROM jobs WHERE status = 'waiting'")
        return int(rows[0][0])

    async def job_graph(
        self, job_id: str
    ) -> tuple[list[dependencies.EdgeRow], list[dependencies.EdgeRow], int]:
        """A job's dependencies and dependents with their states, and its open dependencies' count."""
        async with self.transaction() as tx:
            return await dependencies.graph_of(tx, job_id)

    async def dependency_results(
        self, job_ids: Sequence[str], max_bytes: int = dependencies.MAX_RESULTS_BYTES
    ) -> dict[str, list[tuple[str, str, str, bytes, bool]]]:
        """Per job: (id, type, state, result, truncated) of its finished dependencies, read in one
        transaction (a lease message's jobs)."""
        async with self.transaction() as tx:
            return await dependencies.results_of(tx, job_ids, max_bytes)

    async def resolve_stale(self, shard: int) -> int:
        """The reconciler's safety net (issue 21): resolve the open edges of the shard's waiting jobs
        on jobs that finished or are gone. Returns how many dependencies it resolved."""

        async def resolve(tx: Tx) -> tuple[int, Released]:
            stale = await dependencies.stale_waiting(tx, shard)
            return len(stale), (await release_waiting(tx, stale) if stale else ([], []))

        return await self._resolving(resolve)

    async def get_attempts(self, job_id: str, limit: int = MAX_ATTEMPTS_LISTED) -> list[AttemptRow]:
        """The job's latest ``limit`` runs, oldest first."""
        async with self.transaction() as tx:
            rows = await tx.execute(
                "SELECT attempt, worker, started_at, finished_at, outcome, error, traceback "
                "FROM job_attempts WHERE job_id = ? ORDER BY attempt DESC LIMIT ?",
                (job_id, limit),
            )
        return [AttemptRow(*r) for r in reversed(rows)]

    async def get_jobs(self, ids: Sequence[str]) -> list[JobRow]:
        async with self.transaction() as tx:
            return await rows_of(tx, ids)

    async def search_jobs(
        self, query: JobQuery, limit: int, after: SearchPosition = "", *, newest_first: bool = True
    ) -> list[JobRow]:
        """Up to ``limit`` rows matching ``query`` (newest or oldest first) after ``after``, the
        previous page's last row: by id, or with a finished-time range by (finished_at, id)."""
        if query.matches_nothing():
            return []
        sql, params = query.page_statement(self.backend, COLUMNS, limit, after, newest_first)
        async with self.search_transaction() as tx:
            rows = await tx.execute(sql, params)
        return [JobRow.from_row(r) for r in rows]

    async def active_ids(self, shard: int) -> AsyncIterator[list[str]]:
        """The ids of the shard's non-terminal jobs, in pages."""
        after = ""
        while True:
            async with self.transaction() as tx:
                rows = await tx.execute(
                    "SELECT id FROM jobs WHERE shard = ? AND status IN ('delayed', 'ready', 'leased') "
                    "AND id > ? ORDER BY id LIMIT 2000",
                    (shard, after),
                )
            if not rows:
                return
            ids = [r[0] for r in rows]
            yield ids
            after = ids[-1]

    async def list_dead(self, where: DeadFilter, limit: int, after_id: str = "") -> list[JobRow]:
        sql, params = where.where()
        async with self.transaction() as tx:
            rows = await tx.execute(
                f"SELECT {COLUMNS} FROM jobs WHERE {sql} AND id > ? ORDER BY id LIMIT ?",
                [*params, after_id, limit],
            )
        return [JobRow.from_row(r) for r in rows]

    async def dead_counts(self) -> dict[tuple[str, int], int]:
        """Dead jobs per (type, priority): a row per queue that the triggers of migration 0006 keep
        with every status change, so the cost does not grow with the dead-letter queue."""
        async with self.transaction() as tx:
            rows = await tx.execute("SELECT type, priority, n FROM dead_counts WHERE n > 0")
        return {(r[0], int(r[1])): int(r[2]) for r in rows}

    async def requeue_dead(self, ids: Sequence[str], run_at: int) -> set[str]:
        """Dead jobs back to delayed, with a fresh attempt budget. Returns the ids requeued: a job
        no longer dead, or deleted by retention since it was read, is not."""
        requeued: set[str] = set()
        async with self.transaction() as tx:
            for i in range(0, len(ids), 500):
                chunk = list(ids[i : i + 500])
                marks = ", ".join("?" * len(chunk))
                rows = await tx.execute(
                    "UPDATE jobs SET status = 'delayed', run_at = ?, failures = 0, expirations = 0, "
                    "dead_reason = NULL, finished_at = NULL, updated_at = ? "
                    f"WHERE status = 'dead' AND id IN ({marks}) RETURNING id",
                    [run_at, wall_ms(), *chunk],
                )
                requeued.update(str(r[0]) for r in rows)
        return requeued

    async def purge_dead(self, where: DeadFilter) -> int:
        sql, params = where.where()
        async with self.transaction() as tx:
            rows = await tx.execute(f"DELETE FROM jobs WHERE {sql} RETURNING id", params)
            await delete_attempts(tx, [str(r[0]) for r in rows])
        return len(rows)

    async def set_cancelled(self, job_id: str) -> str | None:
        """Cancel a job Redis does not hold (its row is the only copy) unless its row says it has
        finished. Returns its status after: "cancelled", or the one it finished with; None without
        a row."""

        async def cancel(tx: Tx) -> tuple[str | None, Released]:
            rows = await tx.execute(
                "UPDATE jobs SET status = 'cancelled', finished_at = ?, updated_at = ? WHERE id = ? "
                "AND status IN ('delayed', 'ready', 'leased', 'waiting') RETURNING status",
                (wall_ms(), wall_ms(), job_id),
            )
            if rows:  # what waits for it under 'fail' is cancelled too; under 'ignore', released
                return str(rows[0][0]), await release_waiting(tx, [job_id])
            rows = await tx.execute("SELECT status FROM jobs WHERE id = ?", (job_id,))
            return (str(rows[0][0]) if rows else None), ([], [])

        return await self._resolving(cancel)

    # -- jobs enqueued by SQL (migration 0008, PostgreSQL only) ------------------------------

    #: whether producers can enqueue in their own transactions (the SQL functions of migration 0008)
    supports_sql_enqueue = False

    async def listen_enqueued(
        self, on_shard: Callable[[int], None], on_listening: Callable[[], None]
    ) -> None:
        """Call ``on_shard(shard)`` as transactions that enqueued jobs of the shard by SQL commit, and
        ``on_listening()`` once listening (commits before it were not heard). Returns or raises
        StoreUnavailable when the connection is lost. Stores without SQL enqueue have nothing to hear."""
        raise NotImplementedError("this store has no SQL enqueue")

    async def shards_to_push(self) -> list[int]:
        """The shards of the jobs enqueued by SQL that no dispatcher has pushed to Redis yet."""
        return []

    async def ids_to_push(self, shard: int, limit: int) -> list[str]:
        """Up to ``limit`` of the shard's jobs enqueued by SQL and not pushed yet, oldest first."""
        return []

    async def forget_to_push(self, ids: Sequence[str]) -> None:
        """These jobs enqueued by SQL are pushed (or in the reconciler's hands): drop their notes."""

    async def awaiting_push(self, ids: Sequence[str]) -> set[str]:
        """Those of these jobs that were enqueued by SQL and are not pushed yet."""
        return set()

    async def write_position(self) -> int:
        """A position in the DB's log at or after every commit made so far (see durable_position)."""
        return 0

    async def durable_position(self) -> int:
        """How far the DB's log is safely on disk: a commit at or before this survives a DB crash,
        non-durable ones included. SQLite's are durable against a crash of the process, which is
        what matters here: always everything."""
        return 2**62

    async def table_bytes(self) -> dict[str, int]:
        """Bytes on disk of the job tables, indexes included (shardq_db_table_bytes)."""
        return {}

    async def vacuum_some(self) -> int:
        """Give some of the file's free pages back to the file system (SQLite); returns how many."""
        return 0

    async def ping(self) -> None:
        async with self.transaction() as tx:
            await tx.execute("SELECT 1")


def _migration_for(name: str, backend: str) -> bool:
    stem, dot, suffix = name.rpartition(".")
    if not dot or suffix != "sql":
        return False
    only_on = stem.partition(".")[2]
    return not only_on or only_on == backend


def _statements(script: str) -> list[str]:
    """The statements of a migration, split at semicolons, except those inside a $$-quoted function
    body (PostgreSQL) or a trigger's BEGIN ... END (SQLite)."""
    lines = [line for line in script.splitlines() if not line.strip().startswith("--")]
    out: list[str] = []
    pending = ""
    for piece in "\n".join(lines).split(";"):
        pending = f"{pending};{piece}" if pending else piece
        if pending.count("$$") % 2 or _open_trigger_body(pending):
            continue
        if pending.strip():
            out.append(pending.strip())
        pending = ""
    if pending.strip():
        out.append(pending.strip())
    return out


def _open_trigger_body(statement: str) -> bool:
    words = statement.split()
    is_trigger = [w.upper() for w in words[:2]] == ["CREATE", "TRIGGER"]
    return is_trigger and "BEGIN" in (w.upper() for w in words) and words[-1].upper() != "END"
