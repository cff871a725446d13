"""Per-shard loop that expires overdue leases: the job retries after backoff or is dead-lettered."""

from __future__ import annotations

from collections.abc import Callable

from .clock import steady_ms, wall_ms
from .config import RetryPolicy
from .ownership import Ownership
from .shard_loop import run_shard_loop
from .wakeup import Wakeup
from .working_set import Transition, WorkingSet

BATCH = 500
MAX_SLEEP_S = 1.0  # leases with a shorter TTL may arrive at any time


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
        self.expired_total = 0

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        await run_shard_loop("reaper", self.shard, self.ownership, self._wake, self._step)

    async def _step(self, epoch: int) -> float:
        # Deadlines are steady time; the retries they cause are due by the wall clock (run_at).
        expired, next_deadline = await self.working_set.reap(
            self.shard, epoch, steady_ms(), BATCH, self.policy, wall_now=wall_ms()
        )
        if expired:
            self.expired_total += len(expired)
            self.on_transitions(expired)
            if len(expired) >= BATCH:
                return 0.0
        delay = MAX_SLEEP_S if next_deadline < 0 else max(0.0, (next_deadline - steady_ms()) / 1000)
        return min(delay, MAX_SLEEP_S)
