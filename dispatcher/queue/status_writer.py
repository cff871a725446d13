"""Write-behind of status transitions to the DB, coalesced per job and committed in batches.

Redis applies every transition first; this writer brings the DB up to date within
about flush_interval_ms (longer while the DB is down: updates are kept and retried).
A lease's own row update waits up to LEASE_WRITE_DELAY_MS, so a job that finishes
by then costs one row write instead of two. Finished records are dropped from Redis
only after their status is committed, so the reconciler never mistakes a finished
job for a lost one: a lag can only cause a re-run after Redis data loss, never a
lost job.

The attempt history (attempts.py) rides on the same entries: the end of a run that did not succeed
is committed in the batch of the job's status update, with its start (its lease's update, when that
is still pending here; the job's row otherwise). Progress reports are kept apart (a report
changes no status): the latest per job, committed with the batches at most every
PROGRESS_WRITE_DELAY_MS, and with the job's final status update at the latest.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import structlog

from shardq_common.clock import steady_ms
from shardq_common.errors import StoreUnavailable
from shardq_common.wakeup import Wakeup, cancelling

from ..ops import metrics
from ..ops.redis_errors import REDIS_ERRORS
from ..ops.redis_faults import note_redis_error
from ..store import AttemptUpdate, Store, StoreUpdate
from . import failpoints
from .states import JobState
from .watches import Watches
from .working_set import Grant, Transition, WorkingSet

log = structlog.get_logger("shardq.status_writer")
DISK_RECHECK_S = 0.2
_TERMINAL = frozenset({"succeeded", "cancelled", "dead"})
LEASE_WRITE_DELAY_MS = 1000
#: Progress reports are written at most this often (all jobs' latest in one statement).
PROGRESS_WRITE_DELAY_MS = 1000


@dataclass
class _Entry:
    shard: int
    update: StoreUpdate
    seq: int  # the oldest record() folded into this entry
    not_before: int  # ms; 0 = as soon as possible
    attempts: dict[int, AttemptUpdate] | None = None  # run number -> its start and/or end

    def add_attempt(self, attempt: AttemptUpdate) -> None:
        if self.attempts is None:
            self.attempts = {attempt.attempt: attempt}
            return
        older = self.attempts.get(attempt.attempt)
        self.attempts[attempt.attempt] = attempt if older is None else attempt.merged_over(older)

    def merge_older(self, older: _Entry) -> None:
        """Fold an older entry of the same job (a batch that failed to commit) under this one."""
        self.update = self.update.merged_over(older.update)
        self.seq = min(self.seq, older.seq)
        if older.attempts:
            newer, self.attempts = self.attempts or {}, dict(older.attempts)
            for attempt in newer.values():
                self.add_attempt(attempt)


class StatusWriter:
    def __init__(
        self,
        store: Store,
        working_set: WorkingSet,
        flush_interval_ms: int,
        *,
        attempt_history: bool = True,
        watches: Watches | None = None,
    ) -> None:
        self.watches = watches or Watches(0)  # told of every update and progress report recorded
        self.store = store
        self.working_set = working_set
        self.interval = flush_interval_ms / 1000
        self.attempt_history = attempt_history  # off: attempts recorded are dropped
        self._progress_pending: dict[str, str] = {}  # job id -> its latest progress (JSON)
        self._progress_due = 0  # steady ms when the pending reports may be written (0: none pending)
        self._pending: dict[str, _Entry] = {}
        self._committing: dict[str, _Entry] = {}
        self._recorded = 0  # record() calls so far
        self._force_upto = 0  # commit entries up to this seq even if deferred (a flush waits on them)
        self._wake = Wakeup()
        self._progress = asyncio.Condition()
        self._lock = asyncio.Lock()  # held while committing and forgetting
        self._task: asyncio.Task[None] | None = None
        self._unforgotten: dict[int, set[str]] = defaultdict(set)
        self._forgets_held: dict[int, list[set[str]]] = defaultdict(list)  # shard -> ids, per block
        self._awaiting_disk: list[tuple[int | None, dict[int, set[str]]]] = []
        self._next_deferred = 0  # the earliest deferred time the loop knows of (0: none)
        self.healthy = True

    def record(
        self, shard: int, update: StoreUpdate, *, defer_ms: int = 0, attempt: AttemptUpdate | None = None
    ) -> None:
        """Record a job's status update (and the start or end of one of its runs) for the DB."""
        self._recorded += 1
        not_before = steady_ms() + defer_ms if defer_ms else 0
        old = self._pending.get(update.id)
        if old is None:
            old = self._pending[update.id] = _Entry(shard, update, self._recorded, not_before)
        else:
            if attempt is not None and self.attempt_history and attempt.started_at is None:
                # The run's lease update is still pending: its start goes with its end.
                attempt.worker = attempt.worker or old.update.worker
                attempt.started_at = old.update.started_at
            old.update = update.merged_over(old.update)
            old.not_before = min(old.not_before, not_before)
        if attempt is not None and self.attempt_history:
            old.add_attempt(attempt)
        self.watches.changed((update.id,))
        if not defer_ms or not self._next_deferred or not_before < self._next_deferred:
            self._next_deferred = not_before
            self._wake.set()

    def record_progress(self, job_id: str, progress: str) -> None:
        """A job's latest progress report (JSON), written within PROGRESS_WRITE_DELAY_MS (or with its
        final status, when it finishes first); one report replaces the one before it."""
        self._progress_pending[job_id] = progress
        self.watches.progress(job_id, progress)
        if not self._progress_due:
            self._progress_due = steady_ms() + PROGRESS_WRITE_DELAY_MS
            asyncio.get_running_loop().call_later(PROGRESS_WRITE_DELAY_MS / 1000, self._wake.set)

    def is_pending(self, job_id: str) -> bool:
        """Whether the DB row of this job is behind Redis right now."""
        return job_id in self._pending or job_id in self._committing

    @property
    def lag(self) -> int:
        return len(self._pending)

    @property
    def _committed(self) -> int:
        """Every record() up to this number is committed."""
        oldest = min((e.seq for e in (*self._pending.values(), *self._committing.values())), default=None)
        return self._recorded if oldest is None else oldest - 1

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="status-writer")

    async def stop(self) -> None:
        """Commit what is pending (trying for a few seconds if the DB is down), then stop."""
        if self._task:
            # Not mid-commit: a transaction cancelled halfway would leave the connection unusable.
            async with self._lock:
                self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._force_upto = self._recorded
        if self._progress_pending:
            self._progress_due = 1  # due now
        error = ""
        for _ in range(10):
            try:
                async with self._lock:
                    await self._commit_once()
                    for _ in range(10):  # let Redis forget what finished, once it is on disk
                        if not self._awaiting_disk:
                            break
                        await asyncio.sleep(DISK_RECHECK_S)
                        await self._forget()
                return
            except StoreUnavailable as exc:
                if cancelling():
                    raise
                error = str(exc)
                await asyncio.sleep(0.5)
        log.error("status updates not committed at shutdown", pending=len(self._pending), error=error)

    async def flush(self, timeout: float = 10.0) -> None:
        """Wait until everything recorded before this call is committed."""
        target = self._recorded
        self._force_upto = max(self._force_upto, target)
        self._wake.set()
        try:
            async with asyncio.timeout(timeout), self._progress:
                await self._progress.wait_for(lambda: self._committed >= target)
        except TimeoutError:
            raise StoreUnavailable("the database is not accepting status updates") from None

    @asynccontextmanager
    async def forgets_held(self, shard: int, ids: Iterable[str]) -> AsyncIterator[None]:
        """Drop none of these jobs' finished records from Redis inside the block (they are dropped
        after it): one of them that Redis does not hold at the start cannot come and go unseen
        meanwhile. Commits go on, so flush() callers do not wait for the block."""
        held = set(ids)
        self._forgets_held[shard].append(held)
        try:
            yield
        finally:
            self._forgets_held[shard].remove(held)
            if not self._forgets_held[shard]:
                del self._forgets_held[shard]
            if shard in self._unforgotten:
                self._wake.set()

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            await self._wait_for_work()
            if self.interval:
                await asyncio.sleep(self.interval)
            try:
                async with self._lock:
                    await self._commit_once()
                backoff = 0.05
                if not self.healthy:
                    log.info("status writes resumed")
                self.healthy = True
            except StoreUnavailable as exc:
                if cancelling():
                    raise
                if self.healthy:
                    log.warning("status writes failing, keeping them to retry", error=str(exc))
                self.healthy = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                self._wake.set()
            except Exception:
                if cancelling():
                    raise
                # Not an outage: some update in the batch is unstorable. Commit them one by one and drop
                # (and log) the ones the DB refuses, so one bad row cannot stop every status write.
                log.exception("status batch refused; committing it row by row")
                async with self._lock:
                    await self._commit_rows()
                self._wake.set()

    async def _wait_for_work(self) -> None:
        """Until something is due: a wake-up, or the earliest deferred entry's time."""
        while True:
            self._wake.clear()
            earliest = min((e.not_before for e in self._pending.values()), default=0)
            self._next_deferred = earliest
            if self._pending and earliest <= steady_ms():
                return
            if self._progress_due and self._progress_due <= steady_ms():
                return
            timeout = (earliest - steady_ms()) / 1000 if self._pending else None
            await self._wake.wait(timeout)
            return

    def _take_due(self) -> dict[str, _Entry]:
        now = steady_ms()
        due = {
            job_id: e
            for job_id, e in self._pending.items()
            if e.not_before <= now or e.seq <= self._force_upto
        }
        for job_id in due:
            del self._pending[job_id]
        return due

    def _take_progress(self, batch: dict[str, _Entry]) -> dict[str, str]:
        """The progress reports to write with this batch: all once due, else those of jobs the batch
        finishes (a report written after its job's final status would be refused)."""
        if not self._progress_pending:
            return {}
        if self._progress_due and self._progress_due <= steady_ms():
            taken, self._progress_pending, self._progress_due = self._progress_pending, {}, 0
            return taken
        return {
            job_id: self._progress_pending.pop(job_id)
            for job_id, entry in batch.items()
            if job_id in self._progress_pending and entry.update.status in _TERMINAL
        }

    def _put_back_progress(self, taken: dict[str, str]) -> None:
        for job_id, progress in taken.items():
            self._progress_pending.setdefault(job_id, progress)
        if self._progress_pending and not self._progress_due:
            self._progress_due = steady_ms()

    async def _commit_once(self) -> None:
        batch = self._take_due()
        progress = self._take_progress(batch)
        if batch or progress:
            self._committing = batch
            failpoints.hit("status.before-commit")
            try:
                await self.store.apply_updates(
                    [e.update for e in batch.values()],
                    [a for e in batch.values() if e.attempts for a in e.attempts.values()],
                    list(progress.items()),
                )
            except BaseException:
                self._committing = {}
                self._put_back_progress(progress)
                for job_id, entry in batch.items():  # keep them, older under newer
                    newer = self._pending.get(job_id)
                    if newer is not None:
                        newer.merge_older(entry)
                    else:
                        self._pending[job_id] = entry
                raise
            self._committing = {}
            if progress:
                metrics.PROGRESS_WRITES.inc(len(progress))
            finished: dict[int, set[str]] = defaultdict(set)
            for entry in batch.values():
                if entry.update.status in _TERMINAL:
                    finished[entry.shard].add(entry.update.id)
            if finished:
                # Status commits are not durable (no fsync wait): Redis may forget a finished job
                # only once the DB's log is on disk past its commit, or a DB crash could lose the
                # only record that it finished (and it would run again).
                self._awaiting_disk.append((await self._position(), finished))
        await self._forget()
        async with self._progress:
            self._progress.notify_all()

    async def _commit_rows(self) -> None:
        batch = self._take_due()
        for job_id, entry in batch.items():
            try:
                await self.store.apply_updates([entry.update], list((entry.attempts or {}).values()))
            except StoreUnavailable:
                self._pending.setdefault(job_id, entry)
            except Exception as exc:
                log.error(
                    "dropped an unstorable status update",
                    job=job_id,
                    status=entry.update.status,
                    error=str(exc),
                )
        async with self._progress:
            self._progress.notify_all()

    async def _position(self) -> int | None:
        try:
            return await self.store.write_position()
        except StoreUnavailable:
            return None  # asked again when it is time to forget

    async def _on_disk(self) -> None:
        """Move the finished jobs whose commits are on disk to the forget list."""
        if not self._awaiting_disk:
            return
        try:
            durable = await self.store.durable_position()
        except StoreUnavailable:
            durable = -1
        waiting = []
        for position, finished in self._awaiting_disk:
            if position is not None and position <= durable:
                for shard, ids in finished.items():
                    self._unforgotten[shard] |= ids
            else:
                waiting.append((position if position is not None else await self._position(), finished))
        self._awaiting_disk = waiting
        if waiting:  # the log reaches the disk within a few hundred ms: look again then
            asyncio.get_running_loop().call_later(DISK_RECHECK_S, self._wake.set)

    async def _forget(self) -> None:
        await self._on_disk()
        for shard in list(self._unforgotten):
            ids = self._unforgotten.pop(shard)
            held = ids.intersection(set().union(*self._forgets_held.get(shard, ())))
            if held:
                self._unforgotten[shard] = held
                ids -= held
            try:
                for chunk in _chunks(sorted(ids), 1000):
                    await self.working_set.forget(shard, chunk)
            except Exception as exc:  # a finished record left behind is harmless; retry later
                self._unforgotten[shard] |= ids
                if isinstance(exc, REDIS_ERRORS):
                    note_redis_error("forget", exc, shard=shard)
                else:
                    log.exception("forget failed", shard=shard)


def _chunks(items: list[str], size: int) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


LEASE_EXPIRED_ERROR = "lease expired: the worker crashed, hung or disconnected"


def lease_update(grant: Grant, now: int, worker: str | None = None) -> StoreUpdate:
    """The row of a job leased to ``worker``: its latest run's start (see attempts.py)."""
    # A lease granted ahead of run_at goes to the worker at run_at (sessions.py): it starts then.
    started_at = max(now, grant.run_at_ms)
    return StoreUpdate(
        grant.id,
        "leased",
        lease_until=grant.deadline_ms,
        attempts=grant.attempt,
        started_at=started_at,
        worker=worker,
    )


def returned_update(t: Transition, now: int) -> StoreUpdate:
    """The DB row of a job whose lease was taken back before its worker received it."""
    if t.state is JobState.CANCELLED:
        return StoreUpdate(t.id, "cancelled", attempts=t.attempts, finished_at=now)
    return StoreUpdate(t.id, str(t.state), attempts=t.attempts)


def transition_update(
    t: Transition, now: int, *, error: str | None = None, result: bytes | None = None
) -> StoreUpdate:
    """The DB row for a job after an ack, nack, expiry or cancel in Redis."""
    state = str(t.state)
    if state == "delayed":
        return StoreUpdate(
            t.id,
            state,
            run_at=t.run_at_ms,
            attempts=t.attempts,
            failures=t.failures,
            expirations=t.expirations,
            last_error=error,
            rate_limited=t.rate_limited or None,
        )
    return StoreUpdate(
        t.id,
        state,
        attempts=t.attempts or None,
        failures=t.failures if t.attempts else None,
        expirations=t.expirations if t.attempts else None,
        last_error=error,
        dead_reason=t.dead_reason or None if state == "dead" else None,
        result=result,
        finished_at=now,
    )
