"""Per-shard loop that moves due delayed jobs to the ready sets.

It sleeps until the earliest run_at in the shard (not a fixed poll), and is woken early when a job
with an earlier run_at arrives. Within LOOKAHEAD_MS of that time it lists the jobs due then and
waits on the precise timer with the list in hand: at the instant, one script call moves them.

The instant is ``ahead_ms`` before the jobs' run_at. The leases they get by then wait in the
dispatcher until run_at (sessions.py): a job starts on time, never before it, without the promote
and lease round trips after its time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from shardq_common.clock import wall_ms
from shardq_common.wakeup import Wakeup

from .ownership import Ownership
from .shard_loop import run_shard_loop
from .working_set import WorkingSet

BATCH = 1000
IDLE_RECHECK_S = 5.0  # safety net for jobs put in Redis by another path (restore, another process)
# How far ahead the due jobs are listed: the event loop's timer brings the promoter this close (it is
# a millisecond or so off), the precise timer does the rest.
LOOKAHEAD_MS = 50


class Promoter:
    def __init__(
        self,
        shard: int,
        working_set: WorkingSet,
        ownership: Ownership,
        on_ready: Callable[[int, Iterable[tuple[str, int]]], None],
        ahead_ms: int = 0,
    ) -> None:
        self.shard = shard
        self.working_set = working_set
        self.ownership = ownership
        self.on_ready = on_ready
        self.ahead_ms = ahead_ms
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
            now = self._now()
            due = await self.working_set.peek_due(self.shard, epoch, now, BATCH, LOOKAHEAD_MS)
        finally:
            self._looking = False
        self._next_due = due.at
        if not due.ids:  # nothing delayed, or the earliest is beyond the look-ahead
            return self._sleep_s(due.at, now)
        if due.at > now and await self._wake.wait_until(due.at - self.ahead_ms):
            return 0.0  # woken before the instant (an earlier job, a change): look again
        promotion = await self.working_set.promote_listed(self.shard, epoch, self._now(), due)
        if promotion.promoted:
            self.promoted_total += promotion.promoted
            self.on_ready(self.shard, promotion.queues)
        self._next_due = promotion.next_due
        return self._sleep_s(promotion.next_due, self._now())

    def _now(self) -> int:
        """The promoter's clock: ahead of the wall clock by ``ahead_ms``."""
        return wall_ms() + self.ahead_ms

    @staticmethod
    def _sleep_s(next_due: int, now: int) -> float:
        """How long to sleep before listing again, for the earliest run_at ``next_due``."""
        if next_due < 0:
            return IDLE_RECHECK_S
        if next_due - now <= LOOKAHEAD_MS:
            return 0.0
        return min((next_due - now - LOOKAHEAD_MS // 2) / 1000, IDLE_RECHECK_S)
