"""What a long-lived worker, producer or dispatcher keeps per thing it met goes once it is no longer in
use: dispatcher pods come back at new addresses, and applications may make up cron expressions; an
entry per address or expression ever used would grow for the life of the process (the bounded-growth
audit, docs/operations.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from dispatcher.config import Settings
from dispatcher.schedules.scheduler import MAX_PARSED_CRONS
from dispatcher.server import RunningDispatcher, start_dispatcher
from dispatcher.store import ScheduleRow
from shardq_common.pb import shardq_pb2 as pb
from tests.support.ports import free_port
from tests.support.wait import wait_for
from worker_sdk import AsyncClient, JobContext, Worker
from worker_sdk._pipelining import EnqueuePipeline


@pytest.fixture
async def running(redis_url: str, db_url: str) -> AsyncIterator[RunningDispatcher]:
    settings = Settings(
        redis_url=redis_url,
        db_url=db_url,
        listen=f"127.0.0.1:{free_port()}",
        processes=1,
        shard_count=4,
        metrics_listen="",
    )
    running = await start_dispatcher(settings)
    try:
        yield running
    finally:
        await running.stop()


async def test_a_worker_keeps_no_count_for_a_dispatcher_it_runs_nothing_on(running) -> None:
    ran: list[str] = []

    async def handle(ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    target = f"127.0.0.1:{running.port}"
    async with (
        AsyncClient(target) as client,
        Worker({"book.t": handle}, target=target, concurrency=4, handle_signals=False) as worker,
    ):
        ids = [await client.enqueue("book.t", {"i": i}) for i in range(5)]
        await wait_for(lambda: set(ids) <= set(ran), timeout=15, message="the jobs never ran")
        await wait_for(lambda: not worker._running, timeout=5)
        assert dict(worker._running_on) == {}


async def test_the_enqueue_pipeline_keeps_no_list_for_an_address_it_is_done_with() -> None:
    async def one(spec: pb.JobSpec, address: str) -> str:
        return f"{address}/{spec.type}"

    async def many(specs: list[pb.JobSpec], address: str) -> list[str]:
        return [f"{address}/{s.type}" for s in specs]

    pipeline = EnqueuePipeline(one, many)
    for address in ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"):
        assert await pipeline.enqueue(pb.JobSpec(type="t"), address) == f"{address}/t"
    await wait_for(lambda: not pipeline._sending, timeout=5)
    assert pipeline._waiting == {}


async def test_the_scheduler_keeps_a_bounded_number_of_parsed_expressions(running) -> None:
    """An application that makes up a cron expression per schedule: the parsed ones kept stay bounded,
    and the one in use stays parsed."""
    scheduler = running.app.scheduler
    daily = ScheduleRow(
        name="daily", cron="0 0 3 * * *", timezone="UTC", type="book.t", shard=0, payload=b"", priority=1,
        max_attempts=3, lease_ttl_ms=60_000, max_lag_ms=60_000, catch_up="latest", enabled=True,
    )  # fmt: skip
    in_use = scheduler.cron_of(daily)
    for n in range(MAX_PARSED_CRONS + 100):
        scheduler.cron_of(replace(daily, name=f"s{n}", cron=f"{n % 60} {n // 60 % 60} {n // 3600} * * *"))
        assert scheduler.cron_of(daily) is in_use
    assert len(scheduler._crons) <= MAX_PARSED_CRONS
