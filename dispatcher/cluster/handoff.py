"""Committed jobs of a shard this process does not own go to the shard's owner (PushJobs); when that
or any push after a commit fails, the shard is flagged so that its owner, whichever process it is,
reconciles it from the DB (the jobs are safe there)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import structlog

from shardq_common.pb import shardq_pb2 as pb

from ..queue.keys import DIRTY_KEY
from ..queue.ownership import Ownership
from ..queue.reconcile_loop import ReconcileLoop
from ..queue.working_set import NewJob
from .coordinator import Coordinator
from .peers import Peers

log = structlog.get_logger("shardq.dispatcher")


class HandOff:
    def __init__(
        self,
        advertise: str,
        redis: Any,
        coordinator: Coordinator,
        peers: Peers,
        ownership: Ownership,
        reconciles: ReconcileLoop,
    ) -> None:
        self.advertise = advertise  # this process's address: a view naming it is stale
        self.redis = redis
        self.coordinator = coordinator
        self.peers = peers
        self.ownership = ownership
        self.reconciles = reconciles
        self._unflagged: set[int] = set()  # shards to flag in DIRTY_KEY once Redis takes the write
        self._flagging: asyncio.Future[None] | None = None

    async def hand_off(self, shard: int, jobs: list[NewJob]) -> None:
        """Committed jobs of a shard another process owns: ask the owner to queue them. When that
        fails, flag the shard so its owner reconciles it from the DB (the jobs are safe there).
        Never raises: the jobs are committed, so the enqueue answers OK whatever fails here."""
        address = None
        try:
            address = self.coordinator.view.address_of_owner(shard)
            if not address:  # the view may predate the shard's current owner: read it again
                address = (await self.coordinator.refresh()).address_of_owner(shard)
            if address and address != self.advertise:
                request = pb.PushJobsRequest(
                    shard=shard,
                    jobs=[pb.PushedJob(id=j.id, record=j.record.pack(), payload=j.payload) for j in jobs],
                )
                await self.peers.shard_service(address).PushJobs(
                    request, timeout=5, metadata=self.peers.metadata
                )
                return
        except grpc.aio.AioRpcError as exc:
            log.warning(
                "hand-off to the shard owner failed", shard=shard, owner=address, code=exc.code().name
            )
        except Exception as exc:
            log.warning("hand-off to the shard owner failed", shard=shard, owner=address, error=repr(exc))
        self.flag_for_reconcile(shard)

    def push_failed(self, shard: int) -> None:
        """Jobs of the shard were committed but Redis did not take them: this process reconciles the
        shard should it own it; another process's owner is reached through the flag alone."""
        self.reconciles.needed(shard)
        if not self.ownership.owns(shard):
            self.flag_for_reconcile(shard)

    def flag_for_reconcile(self, shard: int) -> None:
        """Have the shard's owner, whichever process it is, reconcile it from the DB soon: committed
        jobs of it may be missing from Redis. The flag lives in Redis; while Redis refuses it, it is
        retried in the background (and this process reconciles the shard itself if it owns it)."""
        self.reconciles.needed(shard)
        self._unflagged.add(shard)
        if self._flagging is None or self._flagging.done():
            self._flagging = asyncio.ensure_future(self._flag_unflagged())

    async def _flag_unflagged(self) -> None:
        delay = 0.05
        while self._unflagged:
            shards = sorted(self._unflagged)
            try:
                await self.redis.sadd(DIRTY_KEY, *shards)
            except Exception as exc:
                if delay == 0.05:
                    log.warning("cannot flag shards for reconcile yet", shards=shards, error=str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            self._unflagged.difference_update(shards)
            self.coordinator.wake()
