"""Write-behind of status transitions to the DB, coalesced per job and committed in batches.

Redis applies every transition first; this writer brings the DB up to date within
about flush_interval_ms (longer while the DB is down: updates are kept and retried).
Finished records are dropped from Redis only after their status is committed, so
the reconciler never mistakes a finished job for a lost one. A lag can therefore
only cause a re-run after Redis data loss, never a lost job.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog

from .errors import StoreUnavailable
from .store import Store, StoreUpdate
from .working_set import Grant, Transition, WorkingSet

log = structlog.get_logger("shardq.status_writer")
_TERMINAL = frozenset({"succeeded", "cancelled", "dead"})


class StatusWriter:
    def __init__(self, store: Store, working_set: WorkingSet, flush_interval_ms: int) -> None:
        self.store = store
        self.working_set = working_set
        self.interval = flush_interval_ms / 1000
        self._pending: dict[str, tuple[int, StoreUpdate]] = {}
        self._recorded = 0  # updates recorded so far
        self._committed = 0  # updates whose batch is committed
        self._wake = asyncio.Event()
        self._progress = asyncio.Condition()
        self._lock = asyncio.Lock()  # held while committing and forgetting
        self._task: asyncio.Task[None] | None = None
        self._unforgotten: dict[int, set[str]] = defaultdict(set)
        self._committing: dict[str, tuple[int, StoreUpdate]] = {}
        self.healthy = True

    def record(self, shard: int, update: StoreUpdate) -> None:
        old = self._pending.get(update.id)
        self._pending[update.id] = (shard, update.merged_over(old[1]) if old else update)
        self._recorded += 1
        self._wake.set()

    def is_pending(self, job_id: str) -> bool:
        """Whether the DB row of this job is behind Redis right now."""
        return job_id in self._pending or job_id in self._committing

    @property
    def lag(self) -> int:
        return len(self._pending)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="status-writer")

    async def stop(self) -> None:
        """Commit what is pending (trying for a few seconds if the DB is down), then stop."""
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for _ in range(10):
            try:
                async with self._lock:
                    await self._commit_once()
                return
            except StoreUnavailable:
                await asyncio.sleep(0.5)
        log.error("status updates not committed at shutdown", pending=len(self._pending))

    async def flush(self, timeout: float = 10.0) -> None:
        """Wait until everything recorded before this call is committed."""
        target = self._recorded
        self._wake.set()
        try:
            async with asyncio.timeout(timeout), self._progress:
                await self._progress.wait_for(lambda: self._committed >= target)
        except TimeoutError:
            raise StoreUnavailable("the database is not accepting status updates") from None

    @asynccontextmanager
    async def quiesced(self) -> AsyncIterator[None]:
        """Commit everything pending and hold off further commits (and forgets) inside the block."""
        async with self._lock:
            await self._commit_once()
            yield

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            await self._wake.wait()
            self._wake.clear()
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
                if self.healthy:
                    log.warning("status writes failing, keeping them to retry", error=str(exc))
                self.healthy = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                self._wake.set()
            except Exception:
                # Not an outage: some update in the batch is unstorable. Commit them one by one and drop
                # (and log) the ones the DB refuses, so one bad row cannot stop every status write.
                log.exception("status batch refused; committing it row by row")
                async with self._lock:
                    await self._commit_rows()
                self._wake.set()

    async def _commit_rows(self) -> None:
        batch, self._pending = self._pending, {}
        for job_id, (shard, update) in batch.items():
            try:
                await self.store.apply_updates([update])
            except StoreUnavailable:
                self._pending.setdefault(job_id, (shard, update))
            except Exception as exc:
                log.error(
                    "dropped an unstorable status update", job=job_id, status=update.status, error=str(exc)
                )

    async def _commit_once(self) -> None:
        if self._pending:
            batch, self._pending = self._pending, {}
            target = self._recorded
            self._committing = batch
            try:
                await self.store.apply_updates([u for _, u in batch.values()])
            except BaseException:
                self._committing = {}
                for job_id, (shard, update) in batch.items():  # keep them, older under newer
                    newer = self._pending.get(job_id)
                    self._pending[job_id] = (
                        (shard, newer[1].merged_over(update)) if newer else (shard, update)
                    )
                raise
            self._committing = {}
            for shard, update in batch.values():
                if update.status in _TERMINAL:
                    self._unforgotten[shard].add(update.id)
        else:
            target = self._recorded
        await self._forget()
        async with self._progress:
            self._committed = max(self._committed, target)
            self._progress.notify_all()

    async def _forget(self) -> None:
        for shard in list(self._unforgotten):
            ids = self._unforgotten.pop(shard)
            try:
                for chunk in _chunks(sorted(ids), 1000):
                    await self.working_set.forget(shard, chunk)
            except Exception as exc:  # Redis down: a finished record left behind is harmless; retry later
                self._unforgotten[shard] |= ids
                log.debug("forget failed", shard=shard, error=str(exc))


def _chunks(items: list[str], size: int) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


LEASE_EXPIRED_ERROR = "lease expired: the worker crashed, hung or disconnected"


def lease_update(grant: Grant, now: int) -> StoreUpdate:
    return StoreUpdate(
        grant.id, "leased", lease_until=grant.deadline_ms, attempts=grant.attempt, started_at=now
    )


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
