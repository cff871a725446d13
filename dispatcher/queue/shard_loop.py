"""The loop shape every per-shard background task shares: run one step under the shard's epoch,
recover or stop when the epoch is refused, back off on any Redis error (down, or refusing writes),
sleep until woken."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from shardq_common.errors import NotOwner, StoreUnavailable
from shardq_common.wakeup import Wakeup, cancelling

from ..ops.redis_errors import REDIS_ERRORS
from ..ops.redis_faults import note_redis_error
from .ownership import Ownership

log = structlog.get_logger("shardq.shard_loop")
MAX_BACKOFF_S = 2.0


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
            try:
                sleep_s = await step(epoch)
            except NotOwner:
                # Recovery talks to Redis too (and reconciles the shard when it was lost).
                if not await ownership.recover(shard, epoch):
                    return
                continue
            backoff = 0.05
        except REDIS_ERRORS as exc:
            if cancelling():
                raise
            note_redis_error(name, exc, shard=shard)
        except StoreUnavailable as exc:  # recovering the shard takes a new epoch from the DB
            if cancelling():
                raise
            log.warning("database unavailable", loop=name, shard=shard, error=str(exc))
        else:
            if cancelling():
                # Cancelled during the step, yet it returned: on Python 3.11 redis-py's wait_for
                # returns a reply that arrives with the cancellation and drops the latter. The
                # shard's loss waits for this loop to end, so it must not sleep first.
                raise asyncio.CancelledError
            if sleep_s > 0:
                await wake.wait(sleep_s)
            continue
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, MAX_BACKOFF_S)
