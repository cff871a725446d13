"""Membership and shard placement: the loop that decides which shards this process should own.

Every tick it renews this process's membership (``shardq:alive``), reads the live
members, the assignment written by ``dispatcherctl rebalance`` (``shardq:assignment``)
and every shard's owner, and then:

* a shard assigned to a live member belongs to that member; a shard whose assigned
  member is dead (or that has no assignment yet) belongs to the member that
  rendezvous hashing picks among the live ones (shardmap.fallback_owner), which every
  process computes alike;
* shards this process owns but should not are released (their next owner takes them
  at once); shards it should own are acquired once their holder released them or let
  the ownership lease lapse;
* owned shards' ownership leases are renewed; shards flagged dirty (a hand-off of new
  jobs to the owner failed) are reconciled from the DB;
* when another Redis master answers than at the last tick (a failover, a restart), every
  owned shard is reconciled from the DB (failover.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import structlog

from shardmap import fallback_owner
from shardq_common.clock import steady_ms
from shardq_common.wakeup import Wakeup, cancelling

from ..ops.redis_errors import REDIS_ERRORS
from ..ops.redis_faults import note_redis_error
from ..queue.keys import ALIVE_KEY, ASSIGNMENT_KEY, DIRTY_KEY, MEMBERS_KEY
from ..queue.ownership import Ownership
from ..queue.reconcile_loop import ReconcileLoop
from ..queue.working_set import WorkingSet
from .failover import MasterWatch

log = structlog.get_logger("shardq.coordinator")


# A membership lapsed this long ago is forgotten (its id and address), whoever notices first.
FORGET_MEMBER_MS = 3_600_000


@dataclass
class ClusterView:
    """The last map this process read: who is alive and who owns what."""

    members: dict[str, str] = field(default_factory=dict)  # live member id -> address
    known: dict[str, str] = field(default_factory=dict)  # every registered member id -> address
    owners: dict[int, tuple[str, int, int]] = field(default_factory=dict)  # shard -> (owner, epoch, until)
    assignment: dict[int, str] = field(default_factory=dict)

    def address_of_owner(self, shard: int) -> str | None:
        owner = self.owners.get(shard, ("", 0, 0))[0]
        return self.members.get(owner) if owner else None


class Coordinator:
    def __init__(
        self,
        member_id: str,
        advertise: str,
        redis: Any,
        working_set: WorkingSet,
        ownership: Ownership,
        reconciles: ReconcileLoop,
        shard_count: int,
        ownership_ttl_ms: int,
        tick_s: float = 1.0,
    ) -> None:
        self.me = member_id
        self.advertise = advertise
        self.redis = redis
        self.working_set = working_set
        self.ownership = ownership
        self.reconciles = reconciles
        self.shard_count = shard_count
        self.ownership_ttl_ms = ownership_ttl_ms
        self.tick_s = min(tick_s, ownership_ttl_ms / 5000)
        self.view = ClusterView()
        self._wake = Wakeup()
        self._stopping = False
        self.master = MasterWatch(redis)

    def wake(self) -> None:
        self._wake.set()

    def stopping(self) -> None:
        """No more placement: the process is leaving."""
        self._stopping = True
        self._wake.set()

    async def join(self) -> None:
        """Register, give peers that start at the same moment a tick to appear, take this process's shards."""
        await self._heartbeat()
        await self.master.changed()  # the master the shards taken below are reconciled on
        await self.refresh()
        if set(self.view.members) - {self.me}:
            await asyncio.sleep(self.tick_s)
        await self.place()

    async def leave(self) -> None:
        self._stopping = True
        for shard in sorted(self.ownership.epochs):
            await self.ownership.release(shard)
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zrem(ALIVE_KEY, self.me)
                pipe.hdel(MEMBERS_KEY, self.me)
                await pipe.execute()
        except REDIS_ERRORS as exc:  # the membership lapses by itself (and is forgotten later)
            note_redis_error("coordinator", exc)

    async def run(self) -> None:
        while not self._stopping:
            self._wake.clear()
            try:
                await self._heartbeat()
                await self.ownership.renew()
                await self.refresh()
                await self.place()
                await self._reconcile_dirty()
                await self._after_failover()
            except REDIS_ERRORS as exc:
                if cancelling():
                    raise
                note_redis_error("coordinator", exc)
            except Exception:
                if cancelling():
                    raise
                log.exception("coordinator tick failed")
            await self._wake.wait(self.tick_s)

    async def _heartbeat(self) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(MEMBERS_KEY, self.me, self.advertise)
            pipe.zadd(ALIVE_KEY, {self.me: steady_ms() + self.ownership_ttl_ms})
            await pipe.execute()

    async def refresh(self) -> ClusterView:
        shard_count = self.shard_count
        now = steady_ms()
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrangebyscore(ALIVE_KEY, now, "+inf")
            pipe.zrangebyscore(ALIVE_KEY, "-inf", now - FORGET_MEMBER_MS)
            pipe.hgetall(MEMBERS_KEY)
            pipe.hgetall(ASSIGNMENT_KEY)
            alive, lapsed_long_ago, known, assignment = await pipe.execute()
        if lapsed_long_ago:
            # Member ids are per process (host and port: a new pod, a new id), so the ids of processes
            # that died accumulated for the life of the cluster, and every shard map carried them all.
            # One that was only frozen registers again at its next heartbeat.
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zrem(ALIVE_KEY, *lapsed_long_ago)
                pipe.hdel(MEMBERS_KEY, *lapsed_long_ago)
                await pipe.execute()
            for member in lapsed_long_ago:
                known.pop(member, None)
        known_map = {_s(k): _s(v) for k, v in known.items()}
        self.view = ClusterView(
            members={_s(m): known_map.get(_s(m), "") for m in alive},
            known=known_map,
            owners=await self.working_set.metas(list(range(shard_count))),
            assignment={int(k): _s(v) for k, v in assignment.items()},
        )
        return self.view

    def desired_owner(self, shard: int) -> str | None:
        members = sorted(self.view.members)
        if not members:
            return None
        assigned = self.view.assignment.get(shard)
        return assigned if assigned in self.view.members else fallback_owner(shard, members)

    async def place(self) -> None:
        if self._stopping:
            return
        ownership = self.ownership
        now = steady_ms()
        to_release, to_acquire = [], []
        for shard in range(self.shard_count):
            desired = self.desired_owner(shard)
            if ownership.owns(shard):
                if desired is not None and desired != self.me:
                    to_release.append(shard)
            elif desired == self.me:
                owner, _, until = self.view.owners.get(shard, ("", 0, 0))
                # A holder that died keeps its lease until it lapses: taking over earlier is refused.
                if owner in ("", self.me) or until < now:
                    to_acquire.append(shard)
        for shard in to_release:
            await ownership.release(shard)
        if to_acquire:
            await ownership.acquire_all(to_acquire)
        if to_release or to_acquire:
            log.info(
                "shards placed",
                released=to_release,
                acquired=[s for s in to_acquire if ownership.owns(s)],
                owned=len(ownership.epochs),
            )

    async def _after_failover(self) -> None:
        if await self.master.changed():
            owned = sorted(self.ownership.epochs)
            log.warning("reconciling the owned shards on the new Redis master", shards=owned)
            self.reconciles.soon_owned(owned, after_loss=True)

    async def _reconcile_dirty(self) -> None:
        dirty = {int(x) for x in await self.redis.smembers(DIRTY_KEY)}
        for shard in sorted(dirty):
            if self.ownership.owns(shard):
                await self.redis.srem(DIRTY_KEY, shard)
                self.reconciles.soon(shard)


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
