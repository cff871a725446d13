"""Which shards this process owns, under which fencing epoch.

Epochs come from the DB (they keep increasing even when Redis loses everything)
and are written into the shard's meta hash in Redis; every script that mutates a
shard's queues checks it. A script that finds a different epoch (or no meta:
Redis lost the shard) raises NotOwner, and ``recover`` takes a fresh epoch:
if Redis had lost the shard we own it again and reconcile it from the DB; if
another process holds a higher epoch, we have lost it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

import structlog

from .clock import now_ms
from .errors import NotOwner
from .store import Store
from .working_set import WorkingSet

log = structlog.get_logger("shardq.ownership")


class Ownership:
    def __init__(
        self,
        owner_id: str,
        store: Store,
        working_set: WorkingSet,
        on_acquired: Callable[[int, int], Awaitable[None]],
    ) -> None:
        self.owner_id = owner_id
        self.store = store
        self.working_set = working_set
        self.on_acquired = on_acquired  # (shard, epoch): reconcile it, start its loops
        self.epochs: dict[int, int] = {}
        self._recovering: dict[int, asyncio.Task[bool]] = {}

    def owns(self, shard: int) -> bool:
        return shard in self.epochs

    def epoch(self, shard: int) -> int:
        try:
            return self.epochs[shard]
        except KeyError:
            raise NotOwner(f"this dispatcher does not own shard {shard}") from None

    async def acquire(self, shards: Iterable[int]) -> None:
        shards = list(shards)
        epochs = await self.store.next_epochs(shards, self.owner_id)
        for shard in shards:
            await self.working_set.acquire(shard, epochs[shard], self.owner_id, now_ms())
            self.epochs[shard] = epochs[shard]
            await self.on_acquired(shard, epochs[shard])

    async def recover(self, shard: int, stale_epoch: int) -> bool:
        """After a NotOwner from a script run under ``stale_epoch``: True when we own the shard again."""
        if self.epochs.get(shard) != stale_epoch:
            return shard in self.epochs  # somebody already recovered it
        task = self._recovering.get(shard)
        if task is None:
            task = asyncio.create_task(self._recover(shard))
            self._recovering[shard] = task
            task.add_done_callback(lambda _: self._recovering.pop(shard, None))
        return await asyncio.shield(task)

    async def _recover(self, shard: int) -> bool:
        epoch = (await self.store.next_epochs([shard], self.owner_id))[shard]
        try:
            fresh = await self.working_set.acquire(shard, epoch, self.owner_id, now_ms())
        except NotOwner:
            log.warning("shard lost to another owner", shard=shard)
            self.epochs.pop(shard, None)
            return False
        self.epochs[shard] = epoch
        log.warning("shard reacquired", shard=shard, epoch=epoch, redis_lost_it=bool(fresh))
        await self.on_acquired(shard, epoch)
        return True
