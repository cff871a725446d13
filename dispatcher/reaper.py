"""Per-shard loop that expires overdue leases: the job retries after backoff or is dead-lettered."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from .clock import now_ms
from .config import RetryPolicy
from .errors import REDIS_DOWN, NotOwner
from .ownership import Ownership
from .wakeup import Wakeup, cancelling
from .working_set import Transition, WorkingSet

log = structlog.get_logger("shardq.reaper")
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
        backoff = 0.05
        while True:
            epoch = self.ownership.epochs.get(self.shard)
            if epoch is None:
                return  # the shard moved; its new owner runs this loop now
            self._wake.clear()  # before looking, so a wake-up during the call is not lost
            try:
                expired, next_deadline = await self.working_set.reap(
                    self.shard, epoch, now_ms(), BATCH, self.policy
                )
                backoff = 0.05
            except NotOwner:
                if not await self.ownership.recover(self.shard, epoch):
                    return
                continue
            except REDIS_DOWN as exc:
                if cancelling():
                    raise
                log.warning("reaper: redis unavailable", shard=self.shard, error=str(exc))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            if expired:
                self.expired_total += len(expired)
                self.on_transitions(expired)
                if len(expired) >= BATCH:
                    continue
            delay = MAX_SLEEP_S if next_deadline < 0 else max(0.0, (next_deadline - now_ms()) / 1000)
            await self._wake.wait(min(delay, MAX_SLEEP_S))
