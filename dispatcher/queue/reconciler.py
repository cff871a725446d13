"""Bring the DB and the Redis working set of a shard back in step.

Every non-terminal job row must be in Redis, and a row must not stay behind a job Redis has
finished (a crashed owner's unwritten status updates: its successor writes them).

Runs when a shard is acquired (start-up, and after Redis lost it), when an enqueue
could not reach Redis after its DB commit, and every reconcile_interval_s. Jobs
Redis does not know are put back as delayed at their run_at (a job that was leased
becomes due now: its lease was lost with Redis, and the old token is rejected).

A job missing from Redis is not always one Redis lost: an enqueue is acknowledged at its commit,
and its push follows. A young job's push is given time to land (IN_FLIGHT_MS), and a job whose push
failed was noted so by the process that held it (note_unpushed.lua): both are put back without
alarm. Only the rest are reported as missing from Redis, the warning an operator reads as data loss.
Once Redis is seen to have lost a shard (note_loss), a job accepted before then is not given that
time: it was lost, not on its way. One accepted since was pushed to the Redis that came after, and
is awaited like any young job; should Redis lose the shard again meanwhile, that later loss decides.

A shard may hold millions of jobs: it is reconciled a page at a time, in a task of its own (the
coordinator's heartbeats and ownership renewals never wait on it, nor do status writes), and the jobs
of each page can be leased as soon as that page is restored.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import structlog

from shardq_common.clock import wall_ms

from ..ops import metrics
from ..store import JobRow, Store
from . import attempts
from .records import JobRecord
from .states import ACTIVE, JobState, Priority
from .status_writer import StatusWriter, transition_update
from .working_set import NewJob, Restored, Transition, WorkingSet

log = structlog.get_logger("shardq.reconciler")
RESTORE_CHUNK = 500  # ids looked up and restored in one go (one restore script call)
# A job is acknowledged at its commit and pushed after it: behind the answer, or handed to the shard's
# owner first (an RPC given up after 5 s). A reconcile that finds a job this young missing gives its
# push this long to land before putting the job back: a push that lands queues it once, as usual; one
# that fails notes the job as unpushed (note_unpushed.lua), and the reconcile puts it back at once.
# Only a job missing past this, and never noted, is one Redis lost: the warning an operator reads
# as data loss. The wait delays the restore of young jobs Redis lost by this much at most, unless
# the loss is noticed (note_loss): the jobs accepted before it are restored at once.
IN_FLIGHT_MS = 10_000
RECHECK_S = 0.25  # how often the young missing jobs are looked for again
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
        concurrency_key=row.concurrency_key or "",
        rate_limited=row.rate_limited,
        headers=json.loads(row.headers) if row.headers else None,
    )


def accepted_at(row: JobRow) -> int:
    """When the job was committed, or released from 'waiting' (its updated_at): its push follows."""
    return max(row.enqueued_at, row.updated_at)


def _push_may_come(accepted: int, now: int, in_flight_ms: int, lost_at: int) -> bool:
    """A job accepted at ``accepted``, since the shard's last loss and less than ``in_flight_ms``
    ago: its push (behind its enqueue's answer, or a hand-off to this process) may not have reached
    Redis yet."""
    return lost_at <= accepted and now - accepted < in_flight_ms


class Reconciler:
    def __init__(
        self,
        store: Store,
        working_set: WorkingSet,
        writer: StatusWriter,
        on_restored: Callable[[int], None] = lambda shard: None,
        in_flight_ms: int = IN_FLIGHT_MS,
    ) -> None:
        self.store = store
        self.working_set = working_set
        self.writer = writer
        self.on_restored = on_restored  # (shard): jobs were put back, due ones can be promoted now
        self.in_flight_ms = in_flight_ms
        self.restored_total = 0
        self._lost_at: dict[int, int] = {}  # shard -> when (wall ms) Redis was last seen to have lost it
        self._locks: dict[int, asyncio.Lock] = {}
        self._slots = asyncio.Semaphore(SHARDS_AT_ONCE)

    def note_loss(self, shard: int, at_ms: int | None = None) -> None:
        """Redis lost the shard's data (its meta was gone, or another master answers), seen at
        ``at_ms`` (now by default): the missing jobs accepted before then are restored at once, young
        ones too, and reported as lost (a push that comes after all finds its job restored and skips
        it). The latest loss is kept and read as each job is judged, so a reconcile under way, or
        awaiting a push, judges by a loss seen after it began."""
        at = wall_ms() if at_ms is None else at_ms
        self._lost_at[shard] = max(self._lost_at.get(shard, 0), at)

    def lost_at(self, shard: int) -> int:
        """When (wall ms) Redis was last seen to have lost the shard's data; 0: never."""
        return self._lost_at.get(shard, 0)

    async def reconcile(self, shard: int, epoch: int, still_owner: Callable[[], bool] = lambda: True) -> int:
        """Restore the shard's active jobs that Redis does not hold, a page at a time (stopping early
        once ``still_owner()`` says the shard is gone). Returns how many."""
        lock = self._locks.setdefault(shard, asyncio.Lock())
        restored = Restored()
        caught_up = 0
        waiting: dict[str, int] = {}  # young jobs missing -> when (wall ms) they were accepted
        try:
            async with lock, self._slots:
                # Waiting jobs (issue 21) are never put in Redis: they are not among the active ids.
                # A resolution missed is made here; the jobs it releases are pushed like any others.
                if await self.store.resolve_stale(shard):
                    log.warning("resolved dependencies of finished jobs that were still open", shard=shard)
                async for ids in self.store.active_ids(shard):
                    if not still_owner():
                        break
                    caught_up += self._catch_up(shard, await self.working_set.finished(shard, ids))
                    async for done in self._restore_chunks(shard, epoch, ids, waiting):
                        restored += done
            # Outside the slot: a shard whose young jobs are awaited holds up no other shard's
            # reconcile. Looking again costs a script call per RESTORE_CHUNK jobs awaited: many are
            # looked at less often.
            pause = RECHECK_S
            while waiting and still_owner():
                await asyncio.sleep(pause)
                started = asyncio.get_running_loop().time()
                again = list(waiting)
                async with lock, self._slots:
                    async for done in self._restore_chunks(shard, epoch, again, waiting):
                        restored += done
                pause = max(RECHECK_S, 4 * (asyncio.get_running_loop().time() - started))
        finally:
            # Said however it ended: a reconcile cut short (the shard taken over fences its next
            # restore) put back what it had restored so far, and the next owner's finds it in Redis.
            if caught_up:
                log.warning("recorded finished jobs whose DB rows were behind", shard=shard, jobs=caught_up)
            if restored.unpushed:
                log.info(
                    "restored committed jobs whose push had failed", shard=shard, restored=restored.unpushed
                )
            if restored.lost:
                log.warning("restored jobs missing from Redis", shard=shard, restored=restored.lost)
        return restored.total

    async def _restore_chunks(
        self, shard: int, epoch: int, ids: list[str], waiting: dict[str, int]
    ) -> AsyncIterator[Restored]:
        """Restore the missing ones of ``ids`` a chunk at a time, yielding what each chunk put back:
        counted as it goes, so a reconcile fenced off in the middle of a page still says what the
        page's first chunks restored."""
        for i in range(0, len(ids), RESTORE_CHUNK):
            chunk = ids[i : i + RESTORE_CHUNK]
            async with self.writer.forgets_held(shard, chunk):
                done = await self._restore_missing(shard, epoch, chunk, waiting)
            if done.total:
                self.restored_total += done.total
                metrics.RESTORED.labels("lost").inc(done.lost)
                metrics.RESTORED.labels("unpushed").inc(done.unpushed)
                self.on_restored(shard)
                yield done

    async def _restore_missing(
        self, shard: int, epoch: int, ids: list[str], waiting: dict[str, int]
    ) -> Restored:
        """Restore those of these jobs that Redis does not hold and that are still active, but for
        ones whose push may still come (``waiting``: they are left there until it is late, or until
        a loss seen since they were accepted says they were lost).

        Their ids were read a moment ago; since then a job may have finished or been cancelled. Its
        row is read again once Redis is found without it: a finished job's record leaves Redis only
        after its status is committed, so the row then says finished. The restore script skips a job
        Redis holds by then or a cancel noted while Redis did not hold it. The caller holds this
        process's forgets of these jobs off, so none can be pushed, finish and leave Redis in between."""
        missing = await self.working_set.missing(shard, ids)
        now = wall_ms()
        lost_at = self.lost_at(shard)
        due: list[str] = []  # rows to read again
        awaited: set[str] = set()  # waited for long enough, noted as unpushed, or lost since
        for job_id in ids:
            accepted = waiting.get(job_id)
            if job_id not in missing:
                waiting.pop(job_id, None)  # pushed meanwhile
            elif accepted is None:
                due.append(job_id)
            elif missing[job_id] or not _push_may_come(accepted, now, self.in_flight_ms, lost_at):
                del waiting[job_id]
                awaited.add(job_id)
                due.append(job_id)
        if not due:
            return Restored()
        rows = [r for r in await self.store.get_jobs(due) if r.status in ACTIVE]
        put_back = []
        for r in rows:
            if (
                r.id not in awaited
                and not missing[r.id]
                and r.attempts == 0  # a job leased once was pushed long ago
                and _push_may_come(accepted_at(r), now, self.in_flight_ms, lost_at)
            ):
                waiting[r.id] = min(accepted_at(r), now)
            else:
                put_back.append(r)
        if not put_back:
            return Restored()
        if self.store.supports_sql_enqueue:
            # Jobs a producer's transaction enqueued (migration 0008) that no owner has pushed yet (it
            # was down at their commit, say) are expected to be missing: noted, not reported as lost.
            awaiting = await self.store.awaiting_push([r.id for r in put_back])
            if awaiting:
                await self.working_set.note_unpushed(shard, sorted(awaiting), now)
        jobs = [NewJob(r.id, record_from_row(r, now), r.payload) for r in put_back]
        # A job whose row says leased may still be running: restored leased until its lease's end
        # when its type has a concurrency limit, so the limit counts it (restore_jobs.lua).
        deadlines = {r.id: r.lease_until for r in put_back if r.status == "leased" and r.lease_until}
        return await self.working_set.restore(shard, epoch, "restore", jobs, deadlines)

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
                rate_limited=rec.rate_limited,
            )
            ended = attempts.caught_up(transition, now)
            self.writer.record(shard, transition_update(transition, now, result=result), attempt=ended)
        return len(finished)
