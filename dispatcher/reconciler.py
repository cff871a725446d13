"""Bring the DB and the Redis working set of a shard back in step.

Every non-terminal job row must be in Redis, and a row must not stay behind a job Redis has
finished (a crashed owner's unwritten status updates: its successor writes them).

Runs when a shard is acquired (start-up, and after Redis lost it), when an enqueue
could not reach Redis after its DB commit, and every reconcile_interval_s. Jobs
Redis does not know are put back as delayed at their run_at (a job that was leased
becomes due now: its lease was lost with Redis, and the old token is rejected).
"""

from __future__ import annotations

import asyncio

import structlog

from . import metrics
from .clock import wall_ms
from .records import JobRecord
from .states import JobState, Priority
from .status_writer import StatusWriter, transition_update
from .store import JobRow, Store
from .working_set import NewJob, Transition, WorkingSet

log = structlog.get_logger("shardq.reconciler")


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
    def __init__(self, store: Store, working_set: WorkingSet, writer: StatusWriter) -> None:
        self.store = store
        self.working_set = working_set
        self.writer = writer
        self.restored_total = 0
        self._locks: dict[int, asyncio.Lock] = {}

    async def reconcile(self, shard: int, epoch: int) -> int:
        """Restore the shard's jobs that Redis does not hold. Returns how many."""
        lock = self._locks.setdefault(shard, asyncio.Lock())
        restored = caught_up = 0
        async with lock, self.writer.quiesced():
            async for ids in self.store.active_ids(shard):
                missing = await self.working_set.missing(shard, ids)
                caught_up += self._catch_up(shard, await self.working_set.finished(shard, ids))
                if not missing:
                    continue
                now = wall_ms()
                rows = await self.store.get_jobs(missing)
                jobs = [NewJob(r.id, record_from_row(r, now), r.payload) for r in rows]
                for i in range(0, len(jobs), 500):
                    restored += await self.working_set.restore(shard, epoch, "restore", jobs[i : i + 500])
        if caught_up:
            log.warning("recorded finished jobs whose DB rows were behind", shard=shard, jobs=caught_up)
        if restored:
            self.restored_total += restored
            metrics.RESTORED.inc(restored)
            log.warning("restored jobs missing from Redis", shard=shard, restored=restored)
        return restored

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
