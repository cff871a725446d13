"""A process that commits jobs of a shard another process owns hands them to the owner before the
enqueue answers; when it cannot, the shard is flagged for its owner's reconcile before the answer. Either
way, should the accepting process die right after answering, the jobs do not wait for the owner's next
full reconcile (minutes). Two real dispatchers in one event loop (real Redis, both DBs); the moment a
process's view of the map is stale is forced, the code is the real one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from dispatcher.cluster.coordinator import ClusterView
from dispatcher.config import Settings
from dispatcher.queue.ids import new_job_id
from dispatcher.queue.keys import ShardKeys
from dispatcher.queue.records import JobRecord
from dispatcher.queue.states import JobState, Priority
from dispatcher.queue.working_set import NewJob
from dispatcher.server import RunningDispatcher, start_dispatcher
from dispatcher.store import JobRow
from shardmap import shard_for
from shardq_common.clock import wall_ms
from tests.support.ports import free_port
from tests.support.wait import wait_for

SHARDS = 8


@pytest.fixture
async def start(redis_url: str, db_url: str) -> AsyncIterator[Callable[[], Awaitable[RunningDispatcher]]]:
    started: list[RunningDispatcher] = []

    async def start_one() -> RunningDispatcher:
        settings = Settings(
            redis_url=redis_url,
            db_url=db_url,
            listen=f"127.0.0.1:{free_port()}",
            processes=1,
            shard_count=SHARDS,
            metrics_listen="",
            reconcile_interval_s=3600,  # a job left to the full reconcile would not run in this test
        )
        started.append(await start_dispatcher(settings))
        return started[-1]

    yield start_one
    for running in reversed(started):
        await running.stop()


async def _two_owners(
    start: Callable[[], Awaitable[RunningDispatcher]],
) -> tuple[RunningDispatcher, RunningDispatcher, ClusterView]:
    """A, B and the view A held while it owned every shard."""
    a = await start()
    await wait_for(lambda: len(a.app.ownership.epochs) == SHARDS, timeout=15)
    await wait_for(lambda: len(a.app.coordinator.view.owners) == SHARDS, timeout=15)
    alone = a.app.coordinator.view
    b = await start()
    await wait_for(
        lambda: b.app.ownership.epochs and not set(b.app.ownership.epochs) & set(a.app.ownership.epochs),
        timeout=15,
        message="B never took shards over from A",
    )
    return a, b, alone


def _new_job(shard: int) -> tuple[NewJob, JobRow]:
    now = wall_ms()
    job_type = next(t for t in (f"handed{i}" for i in range(1000)) if shard_for(t, SHARDS) == shard)
    record = JobRecord(
        type=job_type,
        priority=Priority.DEFAULT,
        state=JobState.DELAYED,
        run_at_ms=now,
        enqueued_at_ms=now,
        max_attempts=5,
        lease_ttl_ms=30_000,
    )
    job = NewJob(new_job_id(), record, b"{}")
    row = JobRow(
        job.id, job_type, shard, int(Priority.DEFAULT), job.payload, JobState.READY.value, now, None,
        0, 0, 0, 5, 30_000, None, None, None, None, now, None, None, now,
    )  # fmt: skip
    return job, row


async def _in_redis(running: RunningDispatcher, shard: int, job_id: str) -> bool:
    return bool(await running.app.redis.hexists(ShardKeys(shard).jobs, job_id))


async def test_a_view_still_naming_this_process_is_read_again_and_the_owner_gets_the_jobs(start) -> None:
    """For a moment after a process gives a shard up, its view still names it the owner: it must not
    take that for a failed hand-off (it flagged the shard in the background and answered, and a death
    then left the jobs to the full reconcile)."""
    a, b, alone = await _two_owners(start)
    shard = min(b.app.ownership.epochs)
    job, _ = _new_job(shard)  # not in the DB: only the hand-off itself can queue it
    a.app.coordinator.view = alone  # the view of a moment ago, read by the hand-off before any await
    await a.app.hand_off.hand_off(shard, [job])
    await wait_for(
        lambda: _in_redis(b, shard, job.id), timeout=5, message="the owner never queued the handed-off job"
    )


async def test_a_failed_hand_off_has_the_shard_flagged_before_the_answer(start) -> None:
    """The owner cannot be reached: the enqueue answers once the shard is flagged, so the owner queues
    the committed jobs at its next tick even though the accepting process dies right after answering."""
    a, b, _ = await _two_owners(start)
    shard = min(b.app.ownership.epochs)
    job, row = _new_job(shard)
    await a.app.store.insert_jobs([row])  # committed, as an enqueue's hand-off comes after the commit
    a.app.coordinator.view = ClusterView(
        members={"gone": f"127.0.0.1:{free_port()}"}, owners={shard: ("gone", 1, 0)}
    )
    a.app.coordinator.refresh = _stale_refresh(a.app.coordinator.view)  # type: ignore[method-assign]
    await a.app.hand_off.hand_off(shard, [job])
    # A dies right after answering: what it left to do in the background never happens.
    flagging = a.app.hand_off._flagging
    if flagging is not None and not flagging.done():
        flagging.cancel()
        await asyncio.gather(flagging, return_exceptions=True)
    await wait_for(
        lambda: _in_redis(b, shard, job.id), timeout=10, message="the owner never queued the committed job"
    )


def _stale_refresh(view: ClusterView) -> Callable[[], Awaitable[ClusterView]]:
    async def refresh() -> ClusterView:
        return view

    return refresh
