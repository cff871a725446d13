"""The table keeper: the jobs table's storage kept bounded, off the hot path.

On PostgreSQL, its time partitions are created ahead and retired whole (below); on SQLite, the
pages retention freed are given back to the file system a bounded number at a time (an incremental
vacuum, for a database made with auto_vacuum=INCREMENTAL: store/sqlite.py); on both, the table
sizes are reported (shardq_db_table_bytes).

Every dispatcher runs one; the store's session lock lets one of them at a time create or retire
(store/partitions.py), so several dispatchers are safe and one that dies hands the work on at its
next pass. Every SHARDQ_PARTITION_CHECK_INTERVAL a pass:

1. creates the partitions of the current interval and of SHARDQ_PARTITIONS_AHEAD more (each
   dispatcher also does it at its start, before it takes any job);
2. retires each fresh partition whose range ended at least the cluster's retention period ago:
   every row that finished within its range is then past its period. The survivors are rows not
   finished, rows within their period (a dead one within its 30 days, a type whose own period is
   longer, a row that finished after its partition's range: a retried or long-delayed job) and
   rows whose records Redis still holds (the pruner's rule: found by a scan of the shards' records
   hashes, matching the partition's id prefix). They are copied into ``<partition>_kept`` and the
   rest dropped; a kept partition is dropped when nothing in it survives, and meanwhile belongs to
   the row-by-row pruner (dispatcher/queue/pruner.py);
3. deletes the idempotency keys (and attempt rows) the retired rows left (an orphan key is taken
   over by the next job with it meanwhile), and sets the partition and size gauges.
"""

from __future__ import annotations

import asyncio

import structlog

from shardq_common.clock import wall_ms
from shardq_common.errors import StoreUnavailable

from ..config import PartitionPolicy
from ..ops import metrics
from ..store import Store
from ..store.partitions import LEGACY, Cutoffs, Partition, PartitionQueries, Retirement
from .flow import QueueSettings
from .pruner import Retention
from .working_set import WorkingSet

log = structlog.get_logger("shardq.partitions")


class TableKeeper:
    def __init__(
        self,
        store: Store,
        working_set: WorkingSet,
        retention: Retention,
        policy: PartitionPolicy,
        shard_count: int,
    ) -> None:
        self.store = store
        self.working_set = working_set
        self.retention = retention
        self.policy = policy
        self.shard_count = shard_count
        self.interval_ms = policy.interval_s * 1000
        self.partitioned = store if isinstance(store, PartitionQueries) else None

    async def ensure_ahead(self, now: int | None = None) -> list[str] | None:
        """The partitions of the current interval and the ones ahead (None: another process is at it)."""
        if self.partitioned is None:
            return []
        now = wall_ms() if now is None else now
        created = await self.partitioned.ensure_partitions(
            now, now + self.policy.ahead * self.interval_ms, self.interval_ms
        )
        if created:
            log.info("partitions created", partitions=created)
        return created

    async def run(self) -> None:
        while True:
            try:
                await self.pass_once()
            except asyncio.CancelledError:
                raise
            except StoreUnavailable as exc:
                log.warning("table keeper: database unavailable", error=str(exc))
            except Exception:  # a DDL refused (a lock not granted in time): the next pass tries again
                log.exception("table keeper pass failed")
            await asyncio.sleep(self.policy.check_s)

    async def pass_once(self, now: int | None = None) -> list[tuple[str, Retirement]]:
        """Create ahead, retire what is past, report (PostgreSQL); vacuum and report (SQLite).
        Returns the partitions retired."""
        now = wall_ms() if now is None else now
        done = []
        if self.partitioned is not None:
            await self.ensure_ahead(now)
            if self.retention.policy.interval_s:  # 0: retention is off
                cutoffs = await self.cutoffs(now)
                for partition in await self.partitioned.partitions():
                    if await self._retirable(self.partitioned, partition, cutoffs, now):
                        done.append((partition.name, await self.retire(self.partitioned, partition, cutoffs)))
            await self.report_partitions(self.partitioned, now)
        else:
            freed = await self.store.vacuum_some()
            if freed:
                log.debug("incremental vacuum", pages=freed)
        for table, size in (await self.store.table_bytes()).items():
            metrics.DB_TABLE_BYTES.labels(table).set(size)
        return done

    async def cutoffs(self, now: int) -> Cutoffs:
        """Per job type with settings of its own, and by default, when rows past retention finished."""
        default = self.retention.periods(None)
        by_type = {}
        for row in await self.store.list_queue_settings():
            try:
                periods = self.retention.periods(QueueSettings.from_json(row.job_type, row.settings))
            except Exception:  # written through validation: a hand-edited row (the pruner logs it)
                periods = default
            if periods != default:
                by_type[row.job_type] = (now - periods.finished_s * 1000, now - periods.dead_s * 1000)
        return Cutoffs(now - default.finished_s * 1000, now - default.dead_s * 1000, by_type)

    async def _retirable(self, store: PartitionQueries, p: Partition, cutoffs: Cutoffs, now: int) -> bool:
        """A fresh partition once its range ended a cluster period ago: every row that finished
        within its range is past (a row that finished later, a retried or long-delayed job, survives
        into the kept partition rather than holding the whole day back). A kept partition once every
        finished row in it is past its own period (one probe of its index per type and status)."""
        if p.default or p.hi_ms is None:
            return False
        if p.hi_ms > now - self.retention.policy.succeeded_s * 1000:
            return False
        if not p.kept:
            return True
        newest = await store.newest_finished(p)
        return all(finished_at < cutoffs.of(t, status) for (t, status), finished_at in newest.items())

    async def retire(self, store: PartitionQueries, p: Partition, cutoffs: Cutoffs) -> Retirement:
        held: list[str] = []
        for shard in range(self.shard_count):
            held += await self.working_set.held_between(shard, p.lo, p.hi)
        result = await store.retire_partition(p, cutoffs, held, max_share=self.policy.max_kept_share)
        if result.outcome in ("dropped", "compacted", "kept"):
            metrics.PARTITIONS_DROPPED.labels(result.outcome).inc()
            log.info(
                "partition retired",
                partition=p.name,
                outcome=result.outcome,
                rows=result.rows,
                survivors=result.survivors,
                held_by_redis=len(held),
            )
        if result.outcome in ("dropped", "compacted"):
            await store.sweep_orphans(p.lo, p.hi)
        return result

    async def report_partitions(self, store: PartitionQueries, now: int) -> None:
        parts = await store.partitions()
        current = now - now % self.interval_ms
        kinds = dict.fromkeys(("fresh", "ahead", "kept", "legacy", "default"), 0)
        for p in parts:
            if p.default:
                kinds["default"] += 1
            elif p.kept:
                kinds["kept"] += 1
            elif p.name == LEGACY:
                kinds["legacy"] += 1
            else:
                kinds["fresh"] += 1
                if p.lo_ms is not None and p.lo_ms > current:
                    kinds["ahead"] += 1
        for kind, n in kinds.items():
            metrics.DB_PARTITIONS.labels(kind).set(n)
