"""Bring the DB and the Redis working set of a shard back in step.

Every non-terminal job row must be in Redis, and a row must not stay behind a job Redis has
finished (a crashed owner's unwritten status updates: its successor writes them).

Runs when a shard is acquired (start-up, and after Redis lost it), when an enqueue
could not reach Redis after its DB commit, and every reconcile_interval_s. Jobs
Redis does not know are put back as delayed at their run_at (a job that was leased
becomes due now: its lease was lost with Redis, and the old token is rejected).

A shard may hold millions of jobs: it is reconciled a page at a time, in a task of its own (the
coordinator's heartbeats and ownership renewals never wait on it, nor do status writes), and the jobs
of each page can be leased as soon as that page is restored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from shardq_common.clock import wall_ms

from ..ops import metrics
from ..store import JobRow, Store
from .records import JobRecord
from .states import ACTIVE, JobState, Priority
from .status_writer import StatusWriter, transition_update
from .working_set import NewJob, Transition, WorkingSet

log = structlog.get_logger("shardq.reconciler")
RESTORE_CHUNK = 500  # ids looked up and restored in one go (one restore script call)
# Shards reconciled at once (a full sweep, or Redis losing every shard, asks for all of them): each
# keeps a DB connection busy, and the status writer and enqueues need the pool's others.
SHARDS_AT_ONCE = 2


def record_from_row(row: JobRow, now: int, *, requeue: bool = False) -> JobRecord:
    run_at = now if requeue or row.status == "leased" else row.run_at
    return JobRecord(
        type=row.type,
        priority=Priority(row.priority),
        state=JobState.DELAYED,
        run_at_ms=run_at,
        enqueued_at_ms=row.enqueued_at,
        max_attempts=row.max_attempts,
        lease_ttl_ms=row.lease_ttl_ms,
        attempts=row.attempts,
        failures=0 if requeue else row.failures,
        expirations=0 if requeue else row.expirations,
        idempotency_key=row.idem_key or "",
    )


class Reconciler:
    def __init__(
        self,
        store: Store,
        working_set: WorkingSet,
        writer: StatusWriter,
        on_restored: Callable[[int], None] = lambda shard: None,
    ) -> None:
        self.store = store
        self.working_set = working_set
        self.writer = writer
        self.on_restored = on_restored  # (shard): jobs were put back, due ones can be promoted now
        self.restored_total = 0
        self._locks: dict[int, asyncio.Lock] = {}
        self._slots = asyncio.Semaphore(SHARDS_AT_ONCE)

    async def reconcile(self, shard: int, epoch: int, still_owner: Callable[[], bool] = lambda: True) -> int:
        """Restore the shard's active jobs that Redis does not hold, a page at a time (stopping early
        once ``still_owner()`` says the shard is gone). Returns how many."""
        lock = self._locks.setdefault(shard, asyncio.Lock())
        restored = caught_up = 0
        async with lock, self._slots:
            async for ids in self.store.active_ids(shard):
                if not still_owner():
                    break
                caught_up += self._catch_up(shard, await self.working_set.finished(shard, ids))
                for i in range(0, len(ids), RESTORE_CHUNK):
                    chunk = ids[i : i + RESTORE_CHUNK]
                    async with self.writer.forgets_held(shard, chunk):
                        n = await self._restore_missing(shard, epoch, chunk)
                    if n:
                        restored += n
                        self.restored_total += n
                        metrics.RESTORED.inc(n)
                        self.on_restored(shard)
        if caught_up:
            log.warning("recorded finished jobs whose DB rows were behind", shard=shard, jobs=caught_up)
        if restored:
            log.warning("restored jobs missing from Redis", shard=shard, restored=restored)
        return restored

    async def _restore_missing(self, shard: int, epoch: int, ids: list[str]) -> int:
        """Restore those of these jobs that Redis does not hold and that are still active. Returns how many.

        Their ids were read a moment ago; since then a job may have finished or been cancelled. Its
        row is read again once Redis is found without it: a finished job's record leaves Redis only
        after its status is committed, so the row then says finished. The restore script skips a job
        Redis holds by then or a cancel noted while Redis did not hold it. The caller holds this
        process's forgets of these jobs off, so none can be pushed, finish and leave Redis in between."""
        missing = await self.working_set.missing(shard, ids)
        if not missing:
            return 0
        now = wall_ms()
        rows = [r for r in await self.store.get_jobs(missing) if r.status in ACTIVE]
        if not rows:
            return 0
        jobs = [NewJob(r.id, record_from_row(r, now), r.payload) for r in rows]
        return await self.working_set.restore(shard, epoch, "restore", jobs)

    def _catch_up(self, shard: int, finished: list[tuple[str, JobRecord, bytes | None]]) -> int:
        """Record what Redis says of jobs it finished while their rows still say active, results
        included; the status writer commits it and then lets Redis forget the records, as after any
        ack."""
        now = wall_ms()
        for job_id, rec, result in finished:
            transition = Transition(
                job_id,
                shard,
                rec.state,
                attempts=rec.attempts,
                failures=rec.failures,
                expirations=rec.expirations,
                dead_reason=rec.dead_reason,
            )
            self.writer.record(shard, transition_update(transition, now, result=result))
        return len(finished)
