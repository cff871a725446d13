"""The loop shape every per-shard background task shares: run one step under the shard's epoch,
recover or stop when the epoch is refused, back off while Redis is down, sleep until woken."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from .errors import REDIS_DOWN, NotOwner
from .ownership import Ownership
from .wakeup import Wakeup, cancelling

log = structlog.get_logger("shardq.shard_loop")


async def run_shard_loop(
    name: str, shard: int, ownership: Ownership, wake: Wakeup, step: Callable[[int], Awaitable[float]]
) -> None:
    """``step(epoch)`` returns how long to sleep (0: run again at once). Ends when the shard is gone."""
    backoff = 0.05
    while True:
        epoch = ownership.epochs.get(shard)
        if epoch is None:
            return  # the shard moved; its new owner runs this loop now
        wake.clear()  # before looking, so a wake-up during the step is not lost
        try:
            sleep_s = await step(epoch)
            backoff = 0.05
        except NotOwner:
            if not await ownership.recover(shard, epoch):
                return
            continue
        except REDIS_DOWN as exc:
            if cancelling():
                raise
            log.warning("redis unavailable", loop=name, shard=shard, error=str(exc))
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)
            continue
        if sleep_s > 0:
            await wake.wait(sleep_s)
