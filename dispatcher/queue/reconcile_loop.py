"""When the owned shards are reconciled (reconciler.py does it): on acquisition, on request (a push
or a hand-off that failed, a dirty flag, a Redis failover), again after a reconcile that failed, and
every reconcile_interval_s for all of them. Each shard is reconciled in a task of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import structlog

from shardq_common.errors import NotOwner

from ..ops.redis_errors import REDIS_ERRORS
from ..ops.redis_faults import note_redis_error
from .ownership import Ownership
from .reconciler import Reconciler

log = structlog.get_logger("shardq.dispatcher")


class ReconcileLoop:
    def __init__(self, reconciler: Reconciler, ownership: Ownership, interval_s: float) -> None:
        self.reconciler = reconciler
        self.ownership = ownership
        self.interval_s = interval_s  # the full sweep of every owned shard
        self._needed: set[int] = set()  # tried by the next round of the loop
        self._running: dict[int, asyncio.Task[None]] = {}

    def needed(self, shard: int) -> None:
        """Committed jobs of the shard may be missing from Redis: reconcile it at the loop's next
        round, should this process own it then."""
        self._needed.add(shard)

    def soon(self, shard: int, *, after_loss: bool = False) -> None:
        """Reconcile the shard in a task of its own: a large shard takes many ownership TTLs, and the
        coordinator's tick (heartbeat, renewals, placement) must not wait on it. A request while one
        runs is kept for after it (its pages may be past the jobs that prompted the request).
        ``after_loss``: Redis lost the shard's data, seen now: what was accepted before is restored
        at once, by this reconcile or by one under way (Reconciler.note_loss)."""
        if after_loss:
            self.reconciler.note_loss(shard)
        running = self._running.get(shard)
        if running is not None and not running.done():
            self._needed.add(shard)
            return
        self._needed.discard(shard)
        self._running[shard] = asyncio.create_task(self._reconcile(shard), name=f"reconcile-{shard}")

    def soon_owned(self, shards: Iterable[int], *, after_loss: bool = False) -> None:
        """Restore these shards from the DB now (those this process owns), each in the background."""
        for shard in shards:
            if shard in self.ownership.epochs:
                self.soon(shard, after_loss=after_loss)

    def tasks(self) -> list[asyncio.Task[None]]:
        """The reconciles under way (cancelled on shutdown)."""
        return list(self._running.values())

    async def _reconcile(self, shard: int) -> None:
        epoch = self.ownership.epochs.get(shard)
        if epoch is None:
            return

        def still_owner() -> bool:
            return self.ownership.epochs.get(shard) == epoch

        try:
            try:
                await self.reconciler.reconcile(shard, epoch, still_owner)
            except NotOwner:
                self._running.pop(shard, None)  # a recovery reconciles the shard again, from the start
                await self.ownership.recover(shard, epoch)
        except REDIS_ERRORS as exc:
            note_redis_error("reconcile", exc, shard=shard)
            self._needed.add(shard)  # tried again by run()
        except Exception as exc:
            log.warning("reconcile failed", shard=shard, error=str(exc))
            self._needed.add(shard)  # tried again by run()

    async def run(self) -> None:
        last_full = asyncio.get_running_loop().time()
        while True:
            await asyncio.sleep(1.0)
            full = asyncio.get_running_loop().time() - last_full >= self.interval_s
            shards = set(self.ownership.epochs) if full else self._needed & set(self.ownership.epochs)
            if full:
                last_full = asyncio.get_running_loop().time()
            for shard in sorted(shards):
                self.soon(shard)
