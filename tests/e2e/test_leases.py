"""Lease fencing over a hand-driven worker stream: stale tokens, heartbeats, reclaim after reconnect."""

from __future__ import annotations

import asyncio

import pytest

from shardq_common.pb import shardq_pb2 as pb
from tests.support.raw_worker import RawWorker
from tests.support.wait import wait_for
from worker_sdk import AsyncClient

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


async def test_stale_token_ack_is_rejected_after_the_job_was_re_leased(dispatcher):
    client = AsyncClient(dispatcher.target)
    first, second = RawWorker(dispatcher.target), RawWorker(dispatcher.target)
    try:
        job_id = await client.enqueue("stale", {"n": 1}, lease_ttl=0.3)
        await first.hello("first", ["stale"])
        await first.credit(1)
        old = (await first.next_of("leases")).leases[0]
        assert old.ref.job_id == job_id and old.attempt == 1
        # No heartbeat: the lease expires and the job comes back after a 1 s backoff.
        await second.hello("second", ["stale"])
        await second.credit(1)
        new = (await second.next_of("leases")).leases[0]
        assert new.ref.job_id == job_id and new.attempt == 2 and new.ref.token != old.ref.token
        await first.ack(old.ref)
        rejected = (await first.next_of("rejected")).leases[0]
        assert rejected.ref.token == old.ref.token
        assert (await client.get_job(job_id)).status == "leased"  # the stale ack completed nothing
        await second.ack(new.ref)
        await wait_for(lambda: _status(client, job_id, "succeeded"))
        job = await client.get_job(job_id)
        assert (job.attempts, job.expirations, job.failures) == (2, 1, 0)
    finally:
        await first.close()
        await second.close()
        await client.close()


async def test_heartbeats_keep_a_lease_and_reconnect_reclaims_it(dispatcher):
    client = AsyncClient(dispatcher.target)
    worker = RawWorker(dispatcher.target)
    try:
        job_id = await client.enqueue("beat", None, lease_ttl=0.6)
        await worker.hello("beater", ["beat"])
        await worker.credit(1)
        lease = (await worker.next_of("leases")).leases[0]
        deadline = lease.deadline_ms
        for _ in range(4):  # 1 s in all, well past the 0.6 s TTL, kept alive by heartbeats alone
            await asyncio.sleep(0.25)  # time passing is the point here, not a wait for a condition
            await worker.send(heartbeat=pb.Heartbeat(leases=[lease.ref]))
            extended = (await worker.next_of("extended")).leases[0]
            assert extended.deadline_ms >= deadline + 200
            deadline = extended.deadline_ms
        await worker.close()
        # Reconnect within the grace (1 s in tests) with the same worker id: the lease is reclaimed.
        worker = RawWorker(dispatcher.target)
        await worker.hello("beater", ["beat"], held=[lease.ref])
        await worker.next_of("extended")
        await worker.ack(lease.ref)
        await wait_for(lambda: _status(client, job_id, "succeeded"))
        assert (await client.get_job(job_id)).attempts == 1
    finally:
        await worker.close()
        await client.close()


async def _status(client: AsyncClient, job_id: str, status: str) -> bool:
    return (await client.get_job(job_id)).status == status


async def test_results_carry_the_credit_they_free(dispatcher):
    """Protocol 2: a worker grants new credit in the message that acks, and the dispatcher frees the
    acked slots before it counts the credit (the other way round, a full worker's credit is clipped
    to nothing and it idles with jobs ready)."""
    client = AsyncClient(dispatcher.target)
    worker = RawWorker(dispatcher.target)
    try:
        await client.enqueue_many([{"type": "piggy", "payload": {"n": n}} for n in range(4)])
        welcome = await worker.hello("piggy", ["piggy"], concurrency=2)
        assert welcome.protocol >= 2
        await worker.credit(2)
        first = await worker.leases(2)
        acks = pb.Acks(acks=[pb.Ack(lease=lease.ref) for lease in first])
        await worker.send(acks=acks, then_credit=2)
        second = await worker.leases(2)
        assert {lease.ref.job_id for lease in first}.isdisjoint(lease.ref.job_id for lease in second)
    finally:
        await worker.close()
        await client.close()
