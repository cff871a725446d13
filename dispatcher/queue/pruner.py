"""Retention: the rows of finished jobs are deleted once past their type's retention period.

Each shard's owner runs one pruner (a per-shard loop, started and stopped with the shard's other
loops), so exactly one process deletes a shard's rows at a time; during a hand-over two may overlap
for a moment, which is harmless (a delete of rows already gone deletes nothing). A pass runs every
SHARDQ_RETENTION_INTERVAL: for each job type of the shard with finished rows and each finished
status, it walks the type's rows from the oldest (the ``jobs_finished`` index) up to the cutoff
(now minus the period) and deletes them in batches of SHARDQ_RETENTION_BATCH rows by primary key,
pausing SHARDQ_RETENTION_PAUSE_MS between batches and stopping at SHARDQ_RETENTION_PASS_ROWS, so it
never holds a connection or locks for long and the hot path keeps the DB.

A finished row is deleted only once its job's record is gone from Redis. The status writer drops a
finished record only after its status commit is on disk (status_writer.py); until then the record
is the job's other copy, and a row deleted under it would leave Redis and the DB disagreeing. A
record, once gone, does not come back for a finished row (the reconciler restores only active rows,
and only a requeue makes a dead row active, which the delete's own WHERE checks again), so looking
before deleting is enough: no lock is held between the look and the delete.

On a partitioned PostgreSQL table (store/partitions.py), a fresh partition is retired whole by the
table keeper (queue/table_keeper.py) once its rows are past their period: the pruner leaves it the
rows of the cluster's period or longer that finished after their partition began, and deletes the
rest (rows of a shorter period, of the default and kept partitions, and every row when the
cluster's period is shorter than a partition's interval).

A job's result is a column of its row and goes with it. Idempotency keys and schedule occurrence ids
are columns too: after the delete, an enqueue with the same key creates a new job (see
docs/guarantees.md).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import structlog

from shardmap import shard_for
from shardq_common.clock import steady_ms, wall_ms
from shardq_common.wakeup import Wakeup

from ..config import RetentionPolicy
from ..ops import metrics
from ..store import Store
from ..store.partitions import Partition, PartitionQueries
from ..store.retention import WholeRange
from .flow import QueueSettings
from .ownership import Ownership
from .shard_loop import run_shard_loop
from .type_sweep import SWEEP_INTERVAL_S, sweep_types
from .working_set import WorkingSet

log = structlog.get_logger("shardq.pruner")
#: The statuses whose rows retention deletes: succeeded and cancelled after one period, dead after another.
STATUSES = ("succeeded", "cancelled", "dead")
#: The first pass of a shard starts within this long of its acquisition (spread, not all at once).
FIRST_PASS_SPREAD_S = 5.0
#: After a pass stopped at its row cap: the next one starts this soon (the backlog is worked off
#: pass by pass, paced by the pauses between batches).
BACKLOG_PASS_S = 1.0


@dataclass(frozen=True)
class Periods:
    """A type's retention periods, seconds."""

    finished_s: int
    dead_s: int

    def of(self, status: str) -> int:
        return self.dead_s if status == "dead" else self.finished_s


@dataclass
class PruneResult:
    deleted: int = 0
    #: Rows past their age left for now: their records are still in Redis.
    held: int = 0
    #: Whether every row before the cutoff was looked at (False: stopped at the row cap).
    done: bool = True


async def prune_rows(
    store: Store,
    working_set: WorkingSet,
    job_type: str,
    status: str,
    cutoff_ms: int,
    *,
    shard_count: int,
    batch: int,
    pause_s: float,
    max_rows: int,
    outside: Sequence[WholeRange] = (),
) -> PruneResult:
    """Delete the type's rows in ``status`` finished before ``cutoff_ms`` whose records are gone
    from Redis, ``batch`` rows a statement, at most ``max_rows``, but for those of the partitions
    ``outside`` names that their retirement takes."""
    shard = shard_for(job_type, shard_count)
    result = PruneResult()
    after: tuple[int, str] | None = None
    while result.deleted < max_rows:
        rows = await store.finished_before(
            job_type, status, cutoff_ms, min(batch, max_rows - result.deleted), after, outside
        )
        if not rows:
            return result
        after = (rows[-1][1], rows[-1][0])
        ids = [job_id for job_id, _ in rows]
        gone = await working_set.missing(shard, ids)
        deletable = [job_id for job_id in ids if job_id in gone]
        result.held += len(ids) - len(deletable)
        n = await store.delete_finished(deletable, status, cutoff_ms)
        if n:
            metrics.PRUNED.labels(metrics.type_label(job_type), status).inc(n)
            result.deleted += n
        if len(rows) < batch:
            return result
        await asyncio.sleep(pause_s)
    result.done = False
    return result


def whole_ranges(partitions: Sequence[Partition]) -> list[WholeRange]:
    """The fresh partitions (retired whole): id range and start."""
    return [(p.lo or "", p.hi, p.lo_ms or 0) for p in partitions if p.fresh]


class Retention:
    """One per process: the retention periods of the job types with finished rows, read from the
    DB (the types by a loose scan of the ``jobs_finished`` index, their periods from
    ``queue_settings``) at most once per refresh, and shared by the process's pruners."""

    def __init__(
        self, store: Store, policy: RetentionPolicy, shard_count: int, partition_interval_s: int = 86_400
    ) -> None:
        self.store = store
        self.policy = policy
        self.shard_count = shard_count
        self.partition_interval_s = partition_interval_s
        self.refresh_ms = int(max(1.0, policy.interval_s / 2) * 1000)
        self._types: dict[int, dict[str, Periods]] = {}
        #: The partitions retired whole (PostgreSQL, store/partitions.py).
        self.whole: list[WholeRange] = []
        self._read_at = -1
        self._lock = asyncio.Lock()

    def periods(self, settings: QueueSettings | None) -> Periods:
        return Periods(
            (settings and settings.retain_finished_s) or self.policy.succeeded_s,
            (settings and settings.retain_dead_s) or self.policy.dead_s,
        )

    async def types_of(self, shard: int) -> dict[str, Periods]:
        """The shard's job types with finished rows, each with its periods."""
        async with self._lock:
            if self._read_at < 0 or steady_ms() - self._read_at >= self.refresh_ms:
                await self._read()
        return self._types.get(shard, {})

    async def _read(self) -> None:
        types = await self.store.finished_types()
        configured: dict[str, QueueSettings] = {}
        for row in await self.store.list_queue_settings():
            try:
                configured[row.job_type] = QueueSettings.from_json(row.job_type, row.settings)
            except Exception as exc:  # written through validation: a hand-edited row
                log.error("unreadable queue settings: default retention", type=row.job_type, error=str(exc))
        by_shard: dict[int, dict[str, Periods]] = {}
        for job_type in types:
            by_shard.setdefault(shard_for(job_type, self.shard_count), {})[job_type] = self.periods(
                configured.get(job_type)
            )
        self._types = by_shard
        if isinstance(self.store, PartitionQueries):
            self.whole = whole_ranges(await self.store.partitions())
        self._read_at = steady_ms()

    def outside(self, period_s: int) -> list[WholeRange]:
        """The ranges the row pruner leaves alone for rows of this period: on a partitioned table,
        those of the partitions retired whole when their period is at least the cluster's (the
        retirement takes them, or copies them out to kept partitions). A partition retires once its
        last rows are past, up to an interval after its first: shorter periods, and every period
        when the cluster's is shorter than an interval, are pruned row by row everywhere."""
        cluster_s = self.policy.succeeded_s
        return self.whole if period_s >= cluster_s >= self.partition_interval_s else []


class Pruner:
    """The retention loop of one shard."""

    def __init__(
        self, shard: int, retention: Retention, working_set: WorkingSet, ownership: Ownership
    ) -> None:
        self.shard = shard
        self.retention = retention
        self.working_set = working_set
        self.ownership = ownership
        self.policy = retention.policy
        self._wake = Wakeup()
        self.pruned_total = 0
        self._swept_at: int | None = None

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        try:
            await self._wake.wait(random.uniform(0, min(FIRST_PASS_SPREAD_S, self.policy.interval_s)))
            await run_shard_loop("pruner", self.shard, self.ownership, self._wake, self._step)
        finally:
            metrics.forget_shard_retention(self.shard)

    async def _step(self, epoch: int) -> float:
        """One pass over the shard's types. The epoch is not needed to delete (a delete cannot
        conflict with anything another owner does), only to stop once the shard moved."""
        now = wall_ms()
        left = self.policy.pass_rows
        oldest: dict[str, int] = {}
        overdue_ms = 0
        complete = True
        for job_type, periods in sorted((await self.retention.types_of(self.shard)).items()):
            for status in STATUSES:
                period_ms = periods.of(status) * 1000
                if left > 0:
                    result = await prune_rows(
                        self.retention.store,
                        self.working_set,
                        job_type,
                        status,
                        now - period_ms,
                        shard_count=self.retention.shard_count,
                        batch=self.policy.batch,
                        pause_s=self.policy.pause_ms / 1000,
                        max_rows=left,
                        outside=self.retention.outside(periods.of(status)),
                    )
                    left -= result.deleted
                    self.pruned_total += result.deleted
                    complete = complete and result.done
                    if result.deleted:
                        log.debug(
                            "pruned", shard=self.shard, type=job_type, status=status, rows=result.deleted
                        )
                else:
                    complete = False
                # Overdue rows are the row pruner's; a partition's rows wait for its retirement.
                first = await self.retention.store.oldest_finished(
                    job_type, status, self.retention.outside(periods.of(status))
                )
                if first is not None:
                    age_ms = max(0, now - first)
                    oldest[status] = max(oldest.get(status, 0), age_ms)
                    overdue_ms = max(overdue_ms, age_ms - period_ms)
        shard = str(self.shard)
        for status in STATUSES:
            metrics.OLDEST_FINISHED.labels(shard, status).set(oldest.get(status, 0) / 1000)
        metrics.RETENTION_OVERDUE.labels(shard).set(max(0, overdue_ms) / 1000)
        if complete and (self._swept_at is None or steady_ms() - self._swept_at >= SWEEP_INTERVAL_S * 1000):
            self._swept_at = steady_ms()
            await sweep_types(self.retention.store, self.working_set, self.shard)
        return self.policy.interval_s if complete else BACKLOG_PASS_S


async def prune_older_than(
    store: Store,
    working_set: WorkingSet,
    policy: RetentionPolicy,
    shard_count: int,
    older_than_s: int,
    types: Iterable[str] | None,
    statuses: Sequence[str],
    *,
    dry_run: bool,
    max_rows: int,
) -> tuple[int, bool]:
    """The operator's prune (``dispatcherctl jobs prune``): finished rows older than
    ``older_than_s`` of these types (None: every type) and statuses, whatever their retention.
    Returns (rows deleted, or counted with ``dry_run``; whether more are left past ``max_rows``).
    Any process may run it: the look at Redis before each delete is what makes it safe (see the
    module's docstring), not the shard's ownership."""
    cutoff = wall_ms() - older_than_s * 1000
    chosen = sorted(set(types)) if types is not None else await store.finished_types()
    total = 0
    for job_type in chosen:
        for status in statuses:
            if dry_run:
                total += await store.count_finished_before(job_type, status, cutoff)
                continue
            result = await prune_rows(
                store,
                working_set,
                job_type,
                status,
                cutoff,
                shard_count=shard_count,
                batch=policy.batch,
                pause_s=policy.pause_ms / 1000,
                max_rows=max_rows - total,
            )
            total += result.deleted
            if not result.done or total >= max_rows:
                return total, True
    return total, False
