"""Which shards this process owns, under which fencing epoch, with an ownership lease.

Epochs come from the DB (they keep increasing even when Redis loses everything)
and are written into the shard's meta hash in Redis together with the owner and a
lease deadline; every script that hands out or moves work checks the epoch. The
owner renews its leases; a shard whose owner stopped renewing (crashed, paused,
partitioned) is taken over by another member after the ownership TTL, with a
higher epoch, so the former owner's scripts are rejected when it comes back.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Iterable

import structlog

from shardq_common.clock import steady_ms
from shardq_common.errors import NotOwner

from ..store import Store
from .states import AcquireCode
from .working_set import WorkingSet

log = structlog.get_logger("shardq.ownership")


class Ownership:
    def __init__(
        self,
        owner_id: str,
        store: Store,
        working_set: WorkingSet,
        ttl_ms: int,
        on_acquired: Callable[[int, int, bool], Awaitable[None]],
        on_lost: Callable[[int], Awaitable[None]],
        before_serving: Callable[[int], Awaitable[None]] | None = None,
        reconnect_grace_ms: int | None = None,
    ) -> None:
        self.owner_id = owner_id
        # This process, as opposed to an earlier one under the same id (the supervisor restarts a
        # process under its id): a shard taken back from that one is a takeover too.
        self.incarnation = secrets.token_hex(6)
        # A shard taken over from a process whose ownership lapsed has its leases lapse within this
        # (the workers' time to reconnect and reclaim theirs): leases granted just before that process
        # died may never have reached a worker. None: they keep their deadlines.
        self.reconnect_grace_ms = reconnect_grace_ms
        self.store = store
        self.working_set = working_set
        self.ttl_ms = ttl_ms
        # (shard, epoch, whether Redis had lost the shard): reconcile it, start its loops
        self.on_acquired = on_acquired
        self.on_lost = on_lost  # (shard): stop its loops, move its workers on
        # (shard): what must be in Redis before the shard leases anything (its queue settings,
        # flow_mirror.py). Called once the shard is ours in Redis, before this process serves it: a
        # shard Redis lost comes back without them, and a paused queue would run.
        self.before_serving = before_serving
        self.epochs: dict[int, int] = {}
        self._locks: dict[int, asyncio.Lock] = {}

    def owns(self, shard: int) -> bool:
        return shard in self.epochs

    def epoch(self, shard: int) -> int:
        try:
            return self.epochs[shard]
        except KeyError:
            raise NotOwner(f"this dispatcher does not own shard {shard}") from None

    async def current_epoch(self, shard: int) -> int:
        """The shard's current epoch, ours or its owner's: for rare admin writes (requeue) from any member."""
        epoch = self.epochs.get(shard)
        if epoch is not None:
            return epoch
        metas = await self.working_set.metas([shard])
        if shard not in metas:
            raise NotOwner(f"shard {shard} has no owner right now; try again")
        return metas[shard][1]

    def _lock(self, shard: int) -> asyncio.Lock:
        return self._locks.setdefault(shard, asyncio.Lock())

    async def acquire(self, shard: int) -> bool:
        """Take the shard with a fresh epoch unless a live owner holds it. True when we own it."""
        async with self._lock(shard):
            if shard in self.epochs:
                return True
            taken = await self._take(shard)
        if taken is None:
            return False
        await self.on_acquired(shard, *taken)
        return True

    async def _take(self, shard: int) -> tuple[int, bool] | None:
        """Under the shard's lock: a new epoch from the DB, then the lease in Redis. Returns the epoch
        and whether Redis had lost the shard (its meta was gone), or None when another owner has it."""
        epoch = (await self.store.next_epochs([shard], self.owner_id))[shard]
        now = steady_ms()
        try:
            result = await self.working_set.acquire(
                shard,
                epoch,
                self.owner_id,
                now,
                now + self.ttl_ms,
                incarnation=self.incarnation,
                lapse_at=None if self.reconnect_grace_ms is None else now + self.reconnect_grace_ms,
            )
        except NotOwner:
            return None  # a newer epoch exists in Redis: somebody else took it meanwhile
        if result is AcquireCode.HELD:
            return None
        if self.before_serving is not None:
            await self.before_serving(shard)  # raising: not served now, acquired again later
        self.epochs[shard] = epoch
        lost = result is AcquireCode.ACQUIRED_UNKNOWN
        log.info("shard acquired", shard=shard, epoch=epoch, redis_had_lost_it=lost)
        return epoch, lost

    async def acquire_all(self, shards: Iterable[int]) -> None:
        await asyncio.gather(*(self.acquire(s) for s in shards))

    async def release(self, shard: int) -> None:
        """Stop serving the shard and give it up so its next owner can take it at once."""
        async with self._lock(shard):
            epoch = self.epochs.pop(shard, None)
            if epoch is None:
                return
        await self.on_lost(shard)
        try:
            await self.working_set.release(shard, epoch)
        except Exception as exc:  # Redis down: the lease simply expires
            log.warning("shard release failed; it will expire", shard=shard, error=str(exc))
        log.info("shard released", shard=shard, epoch=epoch)

    async def renew(self) -> None:
        """Extend the leases of every owned shard; a shard whose epoch changed is lost."""
        until = steady_ms() + self.ttl_ms
        for shard, epoch in list(self.epochs.items()):
            if not await self.working_set.renew(shard, epoch, until):
                await self.recover(shard, epoch)

    async def recover(self, shard: int, stale_epoch: int) -> bool:
        """After a script refused ``stale_epoch``: True when we own the shard again.

        If Redis lost the shard (no meta), we take it back with a new epoch and the reconciler
        restores it from the DB. If another owner took it, we stop serving it."""
        async with self._lock(shard):
            if self.epochs.get(shard) != stale_epoch:
                return shard in self.epochs  # already handled
            metas = await self.working_set.metas([shard])
            taken = None if shard in metas else await self._take(shard)
            if taken is None:
                self.epochs.pop(shard, None)
        if taken is None:
            owner = metas.get(shard, ("?", 0, 0))
            log.warning(
                "shard taken over by another owner",
                shard=shard,
                stale_epoch=stale_epoch,
                owner=owner[0],
                epoch=owner[1],
            )
            await self.on_lost(shard)
            return False
        await self.on_acquired(shard, *taken)
        return True
