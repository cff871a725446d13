"""Committed jobs of a shard this process does not own go to the shard's owner (PushJobs); when that
or any push after a commit fails, the jobs are noted as unpushed in the shard's Redis keys and the
shard is flagged so that its owner, whichever process it is, reconciles it from the DB (the jobs are
safe there). The note tells that reconcile the jobs were never in Redis: putting them back is
expected, where putting back jobs Redis lost is reported as a loss."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import grpc
import structlog

from shardq_common.clock import wall_ms
from shardq_common.pb import shardq_pb2 as pb

from ..queue.keys import DIRTY_KEY
from ..queue.ownership import Ownership
from ..queue.reconcile_loop import ReconcileLoop
from ..queue.working_set import NewJob, WorkingSet
from .coordinator import Coordinator
from .peers import Peers

log = structlog.get_logger("shardq.dispatcher")
# Ids of unpushed jobs kept while Redis refuses their notes, at most (about 100 bytes each). Past it
# the jobs are still flagged and restored, but reported as missing from Redis.
MAX_UNNOTED = 100_000
# How long an enqueue whose hand-off failed waits for its shard's reconcile flag to reach Redis.
FLAG_WAIT_S = 2.0


class HandOff:
    def __init__(
        self,
        advertise: str,
        redis: Any,
        working_set: WorkingSet,
        coordinator: Coordinator,
        peers: Peers,
        ownership: Ownership,
        reconciles: ReconcileLoop,
    ) -> None:
        self.advertise = advertise  # this process's address: a view naming it is stale
        self.redis = redis
        self.working_set = working_set
        self.coordinator = coordinator
        self.peers = peers
        self.ownership = ownership
        self.reconciles = reconciles
        self._unnoted: dict[int, list[str]] = {}  # shard -> ids to note as unpushed once Redis takes it
        self._unnoted_count = 0
        self._overflowed = False  # ids were left unnoted since the notes last caught up
        self._unflagged: set[int] = set()  # shards to flag in DIRTY_KEY once Redis takes the write
        self._unreconciled: set[int] = set()  # shards this process reconciles once their notes are in
        self._flagging: asyncio.Future[None] | None = None

    async def hand_off(self, shard: int, jobs: list[NewJob]) -> None:
        """Committed jobs of a shard another process owns: ask the owner to queue them. When that
        fails, note them and flag the shard so its owner reconciles it from the DB (the jobs are safe
        there). Never raises: the jobs are committed, so the enqueue answers OK whatever fails here."""
        address = None
        try:
            address = self.coordinator.view.address_of_owner(shard)
            if not address or address == self.advertise:
                # The view predates the shard's current owner (it still names this process for a
                # moment after a release or a loss): read it again.
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
        self.flag_for_reconcile(shard, [j.id for j in jobs])
        # The enqueue answers OK once this returns: were this process to die before the flag is in
        # Redis, the owner would not queue the jobs until its next full reconcile (minutes). While
        # Redis refuses the flag, the answer waits a little, then goes out anyway: the jobs are
        # committed and that reconcile still finds them.
        if self._flagging is not None:
            await asyncio.wait({self._flagging}, timeout=FLAG_WAIT_S)

    def push_failed(self, shard: int, ids: Sequence[str]) -> None:
        """These committed jobs of the shard did not reach Redis: this process reconciles the shard
        should it own it; another process's owner is reached through the flag alone."""
        self._note(shard, ids, flag=not self.ownership.owns(shard))

    def flag_for_reconcile(self, shard: int, ids: Sequence[str]) -> None:
        """Have the shard's owner, whichever process it is, reconcile it from the DB soon: these
        committed jobs of it are missing from Redis."""
        self._note(shard, ids, flag=True)

    def _note(self, shard: int, ids: Sequence[str], *, flag: bool) -> None:
        """Note the jobs as unpushed, then flag the shard (the flag lives in Redis) and reconcile it
        here should this process own it, in that order: the reconcile must find the notes. While
        Redis refuses them, they are retried in the background."""
        room = MAX_UNNOTED - self._unnoted_count
        if len(ids) > room:
            if not self._overflowed:
                log.warning(
                    "too many unpushed jobs wait for Redis to note them: the rest will be reported as "
                    "missing from Redis when restored",
                    shard=shard,
                    waiting=self._unnoted_count,
                )
            self._overflowed = True
            ids = ids[: max(room, 0)]
        if ids:
            self._unnoted.setdefault(shard, []).extend(ids)
            self._unnoted_count += len(ids)
        if flag:
            self._unflagged.add(shard)
        self._unreconciled.add(shard)
        if self._flagging is None or self._flagging.done():
            self._flagging = asyncio.ensure_future(self._note_and_flag())

    async def _note_and_flag(self) -> None:
        delay = 0.05
        while self._unnoted or self._unflagged or self._unreconciled:
            try:
                await self._write_notes()
                # Every shard flagged or to reconcile by now has its notes in.
                shards, here = sorted(self._unflagged), set(self._unreconciled)
                if shards:
                    await self.redis.sadd(DIRTY_KEY, *shards)
            except Exception as exc:
                if delay == 0.05:
                    shards = sorted(self._unflagged | set(self._unnoted))
                    log.warning("cannot flag shards for reconcile yet", shards=shards, error=str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            self._overflowed = False
            self._unflagged.difference_update(shards)
            self._unreconciled.difference_update(here)
            for shard in sorted(here):
                self.reconciles.needed(shard)
            if shards:
                self.coordinator.wake()

    async def _write_notes(self) -> None:
        while self._unnoted:
            shard, ids = next(iter(self._unnoted.items()))
            del self._unnoted[shard]
            try:
                await self.working_set.note_unpushed(shard, ids, wall_ms())
            except BaseException:
                self._unnoted[shard] = ids + self._unnoted.get(shard, [])
                raise
            self._unnoted_count -= len(ids)
