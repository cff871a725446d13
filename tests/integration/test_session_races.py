"""Races between a worker's stream and the dispatcher's own calls, in one real dispatcher (real Redis,
both DBs) driven by a hand-written worker stream: the interleavings are forced, the code is the real one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from dispatcher.config import Settings
from dispatcher.queue.keys import ShardKeys
from dispatcher.queue.records import JobRecord
from dispatcher.queue.states import JobState
from dispatcher.queue.working_set import Grant, LeaseRound
from dispatcher.server import RunningDispatcher, start_dispatcher
from shardmap import shard_for
from tests.support.ports import free_port
from tests.support.raw_worker import RawWorker
from tests.support.wait import wait_for
from worker_sdk import AsyncClient

SHARDS = 8


@pytest.fixture
async def running(redis_url: str, db_url: str) -> AsyncIterator[RunningDispatcher]:
    settings = Settings(
        redis_url=redis_url,
        db_url=db_url,
        listen=f"127.0.0.1:{free_port()}",
        processes=1,
        shard_count=SHARDS,
        metrics_listen="",
        reconnect_grace_ms=1000,
        reconcile_interval_s=3600,
    )
    running = await start_dispatcher(settings)
    try:
        await wait_for(lambda: len(running.app.ownership.epochs) == SHARDS, timeout=15)
        yield running
    finally:
        await running.stop()


async def _record(running: RunningDispatcher, job_type: str, job_id: str) -> JobRecord | None:
    raw = await running.app.redis.hget(ShardKeys(shard_for(job_type, SHARDS)).jobs, job_id)
    return None if raw is None else JobRecord.unpack(raw)


async def test_cancel_of_a_job_that_succeeded_and_left_redis_answers_succeeded(
    running: RunningDispatcher,
) -> None:
    """CancelJob reads the job's row, then asks Redis. In between the job can succeed, its status be
    committed and Redis forget it: the row read first still says it runs. The answer must be the
    job's real status, and the job stays succeeded."""
    app, target = running.app, f"127.0.0.1:{running.port}"
    client, worker = AsyncClient(target), RawWorker(target)
    try:
        job_id = await client.enqueue("done", None)
        await worker.hello("finisher", ["done"])
        await worker.credit(1)
        lease = (await worker.next_of("leases")).leases[0]
        row = await app.store.get_job(job_id)  # what CancelJob reads first
        assert row is not None and row.status in ("ready", "leased"), row
        await worker.ack(lease.ref)
        await wait_for(
            lambda: _forgotten(running, "done", job_id), timeout=15, message="Redis never forgot the job"
        )
        assert (
            await app.canceller.cancel(job_id, row.shard, row.type, row.priority, row.status) == "succeeded"
        )
        after = await app.store.get_job(job_id)
        assert after is not None and after.status == "succeeded"
        assert (await client.get_job(job_id)).status == "succeeded"
    finally:
        await worker.close()
        await client.close()


async def _forgotten(running: RunningDispatcher, job_type: str, job_id: str) -> bool:
    return await _record(running, job_type, job_id) is None


async def test_a_lease_granted_to_a_stream_that_ended_during_the_call_is_returned(
    running: RunningDispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's stream ends while the lease script runs for it: the lease goes back as if never
    granted (its job ready again, the attempt not counted), instead of lapsing after the grace."""
    app, target = running.app, f"127.0.0.1:{running.port}"
    client, gone, next_worker = AsyncClient(target), RawWorker(target), RawWorker(target)
    try:
        await gone.hello("gone", ["late"])
        (session,) = app.sessions.all()
        job_id = await client.enqueue("late", None, lease_ttl=60)
        real_lease = app.working_set.lease
        granted: list[Grant] = []

        async def lease_while_the_stream_ends(*args: Any, **kwargs: Any) -> LeaseRound:
            leased = await real_lease(*args, **kwargs)
            if leased.grants:
                await gone.close()
                await wait_for(lambda: session.closed, message="the stream's end was not seen")
                granted.extend(leased.grants)
            return leased

        monkeypatch.setattr(app.working_set, "lease", lease_while_the_stream_ends)
        await gone.credit(1)
        await wait_for(lambda: granted, timeout=15, message="the job was never leased")
        assert [g.id for g in granted] == [job_id]
        await wait_for(lambda: _state(running, "late", job_id, JobState.READY), timeout=15)
        record = await _record(running, "late", job_id)
        assert record is not None and record.attempts == 0, record
        monkeypatch.undo()
        await next_worker.hello("next", ["late"])
        await next_worker.credit(1)
        lease = (await next_worker.next_of("leases")).leases[0]
        assert (lease.ref.job_id, lease.attempt) == (job_id, 1)
    finally:
        await gone.close()
        await next_worker.close()
        await client.close()


async def _state(running: RunningDispatcher, job_type: str, job_id: str, state: JobState) -> bool:
    record = await _record(running, job_type, job_id)
    return record is not None and record.state is state
