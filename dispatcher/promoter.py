"""Per-shard loop that moves due delayed jobs to the ready sets.

It sleeps until the earliest run_at in the shard (not a fixed poll), and is woken
early when a job with an earlier run_at arrives, so a delayed job becomes ready
within a few milliseconds of its time and never before it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .clock import wall_ms, wall_ms_exact
from .ownership import Ownership
from .shard_loop import run_shard_loop
from .wakeup import Wakeup
from .working_set import WorkingSet

BATCH = 1000
IDLE_RECHECK_S = 5.0  # safety net for jobs put in Redis by another path (restore, another process)
# The event loop's timers fire on whole milliseconds, up to one late: aim this much early. Waking
# before the due time costs a look or two in Redis that find nothing due yet (never a job early).
TIMER_LEAD_S = 0.0005


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
        await run_shard_loop("promoter", self.shard, self.ownership, self._wake, self._step)

    async def _step(self, epoch: int) -> float:
        self._looking = True
        try:
            promotion = await self.working_set.promote(self.shard, epoch, wall_ms(), BATCH)
        finally:
            self._looking = False
        if promotion.promoted:
            self.promoted_total += promotion.promoted
            self.on_ready(self.shard, promotion.queues)
            if promotion.promoted >= BATCH:
                return 0.0
        self._next_due = promotion.next_due
        if promotion.next_due < 0:
            return IDLE_RECHECK_S
        delay = (promotion.next_due - wall_ms_exact()) / 1000 - TIMER_LEAD_S
        return min(max(0.0, delay), IDLE_RECHECK_S)
