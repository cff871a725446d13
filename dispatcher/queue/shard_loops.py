"""The loops each owned shard runs, a promoter, a reaper and a pruner (retention): started when the
shard is acquired, stopped when it is lost, and woken by the paths that change what they wait for."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from ..config import RetryPolicy
from ..ops.task_dump import awaiting_chain
from .ownership import Ownership
from .promoter import Promoter
from .pruner import Pruner, Retention
from .reaper import Reaper
from .working_set import Transition, WorkingSet

log = structlog.get_logger("shardq.shard_loops")
#: How long a lost shard's loops are given to end once cancelled: their steps are short Redis and
#: DB calls, and the coordinator waits meanwhile.
STOP_TIMEOUT_S = 5.0


class ShardLoops:
    def __init__(
        self,
        working_set: WorkingSet,
        ownership: Ownership,
        retry: RetryPolicy,
        lease_ahead_ms: int,
        on_ready: Callable[[int, Iterable[tuple[str, int]]], None],
        on_expired: Callable[[list[Transition]], None],
        retention: Retention | None = None,
    ) -> None:
        self.working_set = working_set
        self.ownership = ownership
        self.retry = retry
        self.lease_ahead_ms = lease_ahead_ms
        self.on_ready = on_ready  # (shard, [(type, class)]): promoted jobs are ready
        self.on_expired = on_expired  # the transitions of the leases a reaper expired
        self.promoters: dict[int, Promoter] = {}
        self.reapers: dict[int, Reaper] = {}
        self.retention = retention
        self.pruners: dict[int, Pruner] = {}
        self._tasks: dict[int, list[asyncio.Task[Any]]] = {}

    def start(self, shard: int) -> None:
        """The shard was acquired: run its loops (a recovery with them still running wakes them)."""
        tasks = self._tasks.get(shard)
        if tasks and not any(t.done() for t in tasks):
            self.promoters[shard].wake()
            return
        self.promoters[shard] = Promoter(
            shard, self.working_set, self.ownership, self.on_ready, ahead_ms=self.lease_ahead_ms
        )
        self.reapers[shard] = Reaper(shard, self.working_set, self.ownership, self.retry, self.on_expired)
        self._tasks[shard] = [
            asyncio.create_task(self.promoters[shard].run(), name=f"promote-{shard}"),
            asyncio.create_task(self.reapers[shard].run(), name=f"reap-{shard}"),
        ]
        if self.retention is not None and self.retention.policy.interval_s:  # 0: retention is off
            self.pruners[shard] = Pruner(shard, self.retention, self.working_set, self.ownership)
            self._tasks[shard].append(asyncio.create_task(self.pruners[shard].run(), name=f"prune-{shard}"))

    async def stop(self, shard: int) -> None:
        """The shard was lost: stop its loops (one of them may be the caller, recovering it)."""
        tasks = self._tasks.pop(shard, [])
        self.pruners.pop(shard, None)
        current = asyncio.current_task()
        for task in tasks:
            if task is not current:
                task.cancel()
        others = [t for t in tasks if t is not current]
        if not others:
            return
        _, stuck = await asyncio.wait(others, timeout=STOP_TIMEOUT_S)
        for task in stuck:  # a bug: said with where it waits, and not waited for (the shard is gone)
            log.error(
                "shard loop did not stop when cancelled", task=task.get_name(), awaiting=awaiting_chain(task)
            )

    def wake_promoter(self, shard: int, run_at_ms: int | None = None) -> None:
        """A job became delayed until ``run_at_ms`` (None: something changed, look again)."""
        promoter = self.promoters.get(shard)
        if promoter is not None:
            promoter.wake(run_at_ms)

    def lease_deadline(self, shard: int, deadline_ms: int) -> None:
        """Leases were granted: the shard's reaper looks again by their earliest deadline."""
        reaper = self.reapers.get(shard)
        if reaper is not None:
            reaper.wake(deadline_ms)

    def restored(self, shard: int) -> None:
        """A reconcile put jobs back: due ones are promoted, and leases it restored (a limited type's
        job whose row said leased) are reaped by their deadlines."""
        self.wake_promoter(shard)
        self.wake_reaper(shard)

    def wake_reaper(self, shard: int) -> None:
        """Lease deadlines were shortened: the shard's reaper looks again now."""
        reaper = self.reapers.get(shard)
        if reaper is not None:
            reaper.wake()
