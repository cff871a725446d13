"""Scheduler loops racing on the same schedules, in one real dispatcher (real Redis, both DBs): each
tick reads the same cursor and materializes the same occurrences; the DB's compare-and-set on the
cursor and the primary key on the occurrence's job id let exactly one of them create each job."""

from __future__ import annotations

import asyncio
from collections import Counter

from dispatcher.config import Settings
from dispatcher.queue.keys import ShardKeys
from dispatcher.schedules.scheduler import Scheduler
from dispatcher.server import start_dispatcher
from shardmap import shard_for
from shardq_common.clock import wall_ms
from shardq_common.pb import shardq_pb2 as pb
from tests.support.ports import free_port
from tests.support.wait import wait_for

ROUNDS = 8


async def test_racing_scheduler_loops_create_each_occurrence_once(redis_url: str, db_url: str) -> None:
    settings = Settings(
        redis_url=redis_url,
        db_url=db_url,
        listen=f"127.0.0.1:{free_port()}",
        processes=1,
        shard_count=8,
        metrics_listen="",
        schedule_tick_ms=60_000,  # the dispatcher's own loop stays out of the way: the test ticks
    )
    running = await start_dispatcher(settings)
    app = running.app
    try:
        await wait_for(lambda: len(app.ownership.epochs) == 8, timeout=15)
        for i in range(3):
            await app.scheduler.declare(
                pb.ScheduleSpec(
                    name=f"race-{i}", cron="* * * * * *", type=f"noop.race{i}", catch_up=pb.CATCH_UP_ALL
                )
            )
        loops = [
            Scheduler(app.settings, app.store, app.ownership, app.ingest, app.canceller) for _ in range(4)
        ]
        for _ in range(ROUNDS):
            await asyncio.gather(*(loop.tick() for loop in loops))
            await asyncio.sleep(0.3)
        for i in range(3):
            async with app.store.transaction() as tx:
                rows = await tx.execute("SELECT id, run_at FROM jobs WHERE schedule = ?", (f"race-{i}",))
            times = Counter(int(r[1]) for r in rows)
            assert times and max(times.values()) == 1, f"race-{i}: an occurrence twice"
            ordered = sorted(times)
            assert ordered == list(range(ordered[0], ordered[-1] + 1, 1000)), f"race-{i}: a gap"
            assert ordered[-1] >= wall_ms()  # the lookahead materialized ahead
            shard = shard_for(f"noop.race{i}", 8)
            in_redis = await app.redis.hlen(ShardKeys(shard).jobs)
            assert in_redis == len(rows), f"race-{i}: Redis holds {in_redis} jobs for {len(rows)} rows"
            info = await app.store.get_schedule(f"race-{i}")
            assert info is not None and info.materialized == len(rows)
    finally:
        await running.stop()
