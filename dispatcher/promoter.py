"""Per-shard loop that moves due delayed jobs to the ready sets.

It sleeps until the earliest run_at in the shard (not a fixed poll), and is woken
early when a job with an earlier run_at arrives, so a delayed job becomes ready
within a few milliseconds of its time and never before it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

import structlog

from .clock import now_ms
from .errors import REDIS_DOWN, NotOwner
from .ownership import Ownership
from .wakeup import Wakeup, cancelling
from .working_set import WorkingSet

log = structlog.get_logger("shardq.promoter")
BATCH = 1000
IDLE_RECHECK_S = 5.0  # safety net for jobs put in Redis by another path (restore, another process)


class Promoter:
    def __init__(
        self,
        shard: int,
        working_set: WorkingSet,
        ownership: Ownership,
        on_ready: Callable[[int, Iterable[tuple[str, int]]], None],
    ) -> None:
        self.shard = shard
        self.working_set = working_set
        self.ownership = ownership
        self.on_ready = on_ready
        self._wake = Wakeup()
        self._next_due = -1
        self._looking = False
        self.promoted_total = 0

    def wake(self, run_at_ms: int | None = None) -> None:
        # While a promote call is in flight its answer about the next due time may already be stale.
        if run_at_ms is None or self._looking or self._next_due < 0 or run_at_ms < self._next_due:
            self._wake.set()

    async def run(self) -> None:
        backoff = 0.05
        while True:
            epoch = self.ownership.epochs.get(self.shard)
            if epoch is None:
                return  # the shard moved; its new owner runs this loop now
            self._wake.clear()  # before looking, so a wake-up during the call is not lost
            try:
                self._looking = True
                try:
                    promotion = await self.working_set.promote(self.shard, epoch, now_ms(), BATCH)
                finally:
                    self._looking = False
                promoted, next_due = promotion.promoted, promotion.next_due
                backoff = 0.05
            except NotOwner:
                if not await self.ownership.recover(self.shard, epoch):
                    return
                continue
            except REDIS_DOWN as exc:
                if cancelling():
                    raise
                log.warning("promoter: redis unavailable", shard=self.shard, error=str(exc))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            if promoted:
                self.promoted_total += promoted
                self.on_ready(self.shard, promotion.queues)
                if promoted >= BATCH:
                    continue
            self._next_due = next_due
            delay = IDLE_RECHECK_S if next_due < 0 else max(0.0, (next_due - now_ms()) / 1000)
            await self._wake.wait(min(delay, IDLE_RECHECK_S))
