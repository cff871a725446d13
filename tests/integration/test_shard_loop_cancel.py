"""A shard's loops are cancelled when the shard is lost, and the coordinator waits for them to end
before it goes on (placing, acquiring, renewing). On Python 3.11 a cancellation that lands as a Redis
reply arrives is swallowed inside redis-py (``asyncio.wait_for`` returns the result instead), so the
step returns normally with a cancel pending: the loop then slept its whole interval (a pruner's is
a minute) with the coordinator waiting on it, and a dispatcher back from a pause took no shard for
that long (seen as tests/e2e/test_sharding.py::test_paused_owner_is_fenced_after_takeover failing:
its coordinator stuck in ShardLoops.stop behind prune-2, found with the SIGUSR1 task dump)."""

from __future__ import annotations

import asyncio

import redis.asyncio as aredis

from dispatcher.queue.shard_loop import run_shard_loop
from shardq_common.wakeup import Wakeup

SHARD = 2


class Owned:
    """What run_shard_loop reads of Ownership: the epochs of the shards owned."""

    def __init__(self) -> None:
        self.epochs = {SHARD: 1}


async def test_a_loop_whose_step_swallowed_its_cancellation_still_ends(redis_url: str) -> None:
    redis = aredis.Redis.from_url(redis_url)
    await redis.ping()  # a warm connection: the reply comes at once
    steps = 0

    async def step(epoch: int) -> float:
        nonlocal steps
        steps += 1
        await redis.blpop(["shardq-test-nothing"], timeout=0.2)
        return 60.0  # a pruner's pass interval

    try:
        for _ in range(5):
            task = asyncio.create_task(run_shard_loop("pruner", SHARD, Owned(), Wakeup(), step))  # type: ignore[arg-type]
            await asyncio.sleep(0)  # the step has sent its command
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=5)
            assert done, "the loop slept on with its cancellation pending"
    finally:
        await redis.aclose()
    assert steps == 5
