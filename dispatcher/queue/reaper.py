"""Per-shard loop that expires overdue leases: the job retries after backoff or is dead-lettered."""

from __future__ import annotations

from collections.abc import Callable

from shardq_common.clock import steady_ms, wall_ms
from shardq_common.wakeup import Wakeup

from ..config import RetryPolicy
from .ownership import Ownership
from .shard_loop import run_shard_loop
from .working_set import Transition, WorkingSet

BATCH = 500
# The loop sleeps until the earliest lease deadline; a lease granted with an earlier one wakes it.
IDLE_RECHECK_S = 5.0  # a safety net only


class Reaper:
    def __init__(
        self,
        shard: int,
        working_set: WorkingSet,
        ownership: Ownership,
        policy: RetryPolicy,
        on_transitions: Callable[[list[Transition]], None],
    ) -> None:
        self.shard = shard
        self.working_set = working_set
        self.ownership = ownership
        self.policy = policy
        self.on_transitions = on_transitions
        self._wake = Wakeup()
        self._next_deadline = -1  # steady ms; -1: none known
        self._looking = False
        self.expired_total = 0

    def wake(self, deadline_ms: int | None = None) -> None:
        """Look now, or (given a new lease's deadline) when that deadline is earlier than planned."""
        # While a reap call is in flight its answer about the next deadline may already be stale.
        if (
            deadline_ms is None
            or self._looking
            or self._next_deadline < 0
            or deadline_ms < self._next_deadline
        ):
            self._wake.set()

    async def run(self) -> None:
        await run_shard_loop("reaper", self.shard, self.ownership, self._wake, self._step)

    async def _step(self, epoch: int) -> float:
        # Deadlines are steady time; the retries they cause are due by the wall clock (run_at).
        self._looking = True
        try:
            expired, next_deadline = await self.working_set.reap(
                self.shard, epoch, steady_ms(), BATCH, self.policy, wall_now=wall_ms()
            )
        finally:
            self._looking = False
        if expired:
            self.expired_total += len(expired)
            self.on_transitions(expired)
            if len(expired) >= BATCH:
                return 0.0
        self._next_deadline = next_deadline
        if next_deadline < 0:
            return IDLE_RECHECK_S
        return min(max(0.0, (next_deadline - steady_ms()) / 1000), IDLE_RECHECK_S)
