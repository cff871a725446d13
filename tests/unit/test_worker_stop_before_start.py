"""A Lease and a Cancel (or a rejection) that the worker handles in one turn of its loop, as when
they arrive together: the job's task is told to stop before its first step. A task cancelled
then runs none of its body: no result is sent and the job never leaves the running set, so its
heartbeats renew the lease forever and its slot is lost. The job must be settled instead: nacked
as cancelled (never run), or dropped without a result when its lease was lost."""

from __future__ import annotations

import pytest

from shardq_common.pb import shardq_pb2 as pb
from tests.support.wait import wait_for
from worker_sdk import JobContext, Worker

ADDRESS = "127.0.0.1:9"  # nothing answers: the links keep retrying, the test never writes to them


@pytest.fixture
async def worker():
    ran: list[str] = []

    async def handler(ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    w = Worker(
        {"t": handler, "t_sync": lambda ctx: ran.append(ctx.job_id)}, target=ADDRESS, handle_signals=False
    )
    w.ran = ran
    yield w
    for link in w._links.values():
        link.task.cancel()
    w._pool.shutdown(wait=False)


def lease(job_id: str, job_type: str) -> pb.Lease:
    ref = pb.LeaseRef(job_id=job_id, token=f"token-{job_id}", shard=0)
    return pb.Lease(ref=ref, type=job_type, attempt=1, max_attempts=5, lease_ttl_ms=60_000)


@pytest.mark.parametrize("job_type", ["t", "t_sync"])
async def test_cancelled_in_the_turn_it_was_leased_never_runs_and_is_nacked(worker, job_type):
    job = lease("j1", job_type)
    worker._start(job, ADDRESS)
    worker._cancel(job.ref)
    await wait_for(lambda: "j1" not in worker._running, timeout=5)
    nacks = [n for link in worker._links.values() for n in link.nacks]
    assert [(n.lease.job_id, n.error, n.retryable) for n in nacks] == [("j1", "cancelled", False)]
    assert worker.ran == []


async def test_lost_in_the_turn_it_was_leased_never_runs_and_sends_nothing(worker):
    job = lease("j2", "t")
    worker._start(job, ADDRESS)
    worker._lose("j2", "lease no longer valid")
    await wait_for(lambda: "j2" not in worker._running, timeout=5)
    assert [m for link in worker._links.values() for m in (*link.acks, *link.nacks)] == []
    assert worker.ran == []
