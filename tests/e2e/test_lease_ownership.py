"""Which stream holds a lease: the clean-up of a worker's old stream shortens only the leases that
stream still holds, not those the worker reclaimed on a new stream (on this dispatcher or another)."""

from __future__ import annotations

import asyncio

import pytest

from shardmap import shard_for
from tests.support.raw_worker import RawWorker
from tests.support.shard_map import settled_view
from tests.support.wait import wait_for, wait_until
from worker_sdk import AsyncClient

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)

JOB_TYPE = "own"
LONG_TTL = 60.0  # s: only the reconnect grace (1 s in tests) can end these leases within a test


async def test_closing_an_old_stream_leaves_alone_the_lease_a_new_stream_reclaimed(dispatcher):
    await _reclaim_then_close_the_old_stream(dispatcher.target, dispatcher.target)


async def test_closing_an_old_stream_leaves_alone_a_lease_reclaimed_on_another_dispatcher(
    start_dispatcher, redis_url, db_url
):
    first, second = start_dispatcher(redis_url, db_url), start_dispatcher(redis_url, db_url)
    view = await asyncio.to_thread(
        wait_until, lambda: settled_view(first.target, 2), 30, message="2 processes never owned every shard"
    )
    assert view is not None
    owner = view.shards[shard_for(JOB_TYPE, view.shard_count)].address
    other = next(p.target for p in (first, second) if p.target != owner)
    await _reclaim_then_close_the_old_stream(owner, other)


async def _reclaim_then_close_the_old_stream(old_target: str, new_target: str) -> None:
    """A worker leases two jobs on one stream, reconnects before that stream is seen dead and
    reclaims one of them on the new stream; then the old stream ends."""
    client = AsyncClient(old_target)
    old, new = RawWorker(old_target), RawWorker(new_target)
    try:
        kept = await client.enqueue(JOB_TYPE, {"n": 1}, lease_ttl=LONG_TTL)
        dropped = await client.enqueue(JOB_TYPE, {"n": 2}, lease_ttl=LONG_TTL)
        await old.hello("owner", [JOB_TYPE], concurrency=2)
        await old.credit(2)
        refs = {lease.ref.job_id: lease.ref for lease in await old.leases(2)}
        assert set(refs) == {kept, dropped}
        await new.hello("owner", [JOB_TYPE], concurrency=2, held=[refs[kept]])
        reclaimed = (await new.next_of("extended")).leases
        assert [e.ref.job_id for e in reclaimed] == [kept]
        await old.close()
        # The lease the old stream still held lapses after the reconnect grace...
        await wait_for(
            lambda: _expirations(client, dropped), timeout=15, message="the old stream's lease never lapsed"
        )
        # ...in the same reaping as the other one, had the clean-up shortened it too.
        job = await client.get_job(kept)
        assert (job.status, job.attempts, job.expirations) == ("leased", 1, 0), job
        await new.ack(refs[kept])
        await wait_for(lambda: _status(client, kept, "succeeded"))
        job = await client.get_job(kept)
        assert (job.attempts, job.expirations) == (1, 0)
    finally:
        await old.close()
        await new.close()
        await client.close()


async def _expirations(client: AsyncClient, job_id: str) -> int:
    return (await client.get_job(job_id)).expirations


async def _status(client: AsyncClient, job_id: str, status: str) -> bool:
    return (await client.get_job(job_id)).status == status
