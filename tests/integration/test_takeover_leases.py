"""A dispatcher that takes a shard over from an owner whose ownership lapsed (it died, or froze) cannot
know which of the shard's leases reached their workers: a lease granted just before the owner died
may never have left it. The workers that did get theirs reconnect and reclaim them; the others must
not wait out the job's whole lease TTL (a minute by default), so a takeover lets every lease lapse
within the reconnect grace, like the leases of a stream that ended. A shard given up cleanly, or taken
back by the same process, keeps its deadlines. Real Redis, the real scripts."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aredis

from dispatcher.queue.ids import new_job_id
from dispatcher.queue.keys import ShardKeys
from dispatcher.queue.records import JobRecord
from dispatcher.queue.states import JobState, Priority
from dispatcher.queue.working_set import NewJob, WorkingSet

SHARD = 5
JOB_TYPE = "noop.taken"
NOW = 1_000_000
TTL_MS = 60_000
GRACE_MS = 5_000


@pytest.fixture
async def working_set(redis_url: str) -> AsyncIterator[WorkingSet]:
    client = aredis.Redis.from_url(redis_url)
    yield WorkingSet(client)
    await client.aclose()


async def _leased_job(ws: WorkingSet, epoch: int) -> str:
    job = NewJob(
        new_job_id(),
        JobRecord(JOB_TYPE, Priority.DEFAULT, JobState.READY, NOW, NOW, max_attempts=3, lease_ttl_ms=TTL_MS),
        b"{}",
    )
    await ws.enqueue(SHARD, epoch, NOW, [job])
    leased = await ws.lease(SHARD, epoch, NOW, [JOB_TYPE], [int(Priority.DEFAULT)], holder="stream-1")
    assert [g.id for g in leased.grants] == [job.id]
    return job.id


async def _deadline(ws: WorkingSet, job_id: str) -> int:
    score = await ws.redis.zscore(ShardKeys(SHARD).leased, job_id)
    record = await ws.record(SHARD, job_id)
    assert record is not None and int(score) == record.deadline_ms
    return int(score)


async def test_a_takeover_from_a_lapsed_owner_lets_its_leases_lapse_within_the_grace(working_set: WorkingSet):
    ws = working_set
    await ws.acquire(SHARD, 1, "dead-owner", NOW, NOW, incarnation="a", lapse_at=NOW + GRACE_MS)
    job_id = await _leased_job(ws, 1)
    assert await _deadline(ws, job_id) == NOW + TTL_MS

    later = NOW + 100  # the dead owner's ownership lapsed at NOW
    await ws.acquire(SHARD, 2, "next-owner", later, later + 3000, incarnation="b", lapse_at=later + GRACE_MS)
    assert await _deadline(ws, job_id) == later + GRACE_MS


@pytest.mark.parametrize("how", ["released", "same process"])
async def test_a_shard_released_or_taken_back_by_the_same_process_keeps_its_deadlines(
    working_set: WorkingSet, how: str
):
    ws = working_set
    await ws.acquire(SHARD, 1, "owner", NOW, NOW, incarnation="a", lapse_at=NOW + GRACE_MS)
    job_id = await _leased_job(ws, 1)
    if how == "released":  # its streams shortened their own leases as they ended (lease_returns.py)
        assert await ws.release(SHARD, 1)
        await ws.acquire(SHARD, 2, "next-owner", NOW, NOW + 3000, incarnation="b", lapse_at=NOW + GRACE_MS)
    else:  # its ownership lapsed a moment (Redis was slow); its streams live on and hold their leases
        await ws.acquire(SHARD, 2, "owner", NOW, NOW + 3000, incarnation="a", lapse_at=NOW + GRACE_MS)
    assert await _deadline(ws, job_id) == NOW + TTL_MS
