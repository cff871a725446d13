"""A sync handler's ``job_timeout`` is its own running time, counted from its start in its thread.

The worker takes leases only for free threads, so no job waits for one in normal running; here two
leases are handed to a one-thread worker directly, so the second waits for the first to finish."""

from __future__ import annotations

import time

import pytest

from shardq_common.pb import shardq_pb2 as pb
from tests.support.wait import wait_for
from worker_sdk import JobContext, Worker

ADDRESS = "127.0.0.1:9"  # nothing answers: the links keep retrying, the test never writes to them
RUNS_FOR = 1.0
JOB_TIMEOUT = 1.9  # more than one run, less than a wait for a thread plus a run


@pytest.fixture
async def worker():
    def slow(ctx: JobContext) -> None:
        time.sleep(RUNS_FOR)

    w = Worker({"slow": slow}, target=ADDRESS, handle_signals=False, concurrency=1, job_timeout=JOB_TIMEOUT)
    yield w
    for link in w._links.values():
        link.task.cancel()
    w._pool.shutdown(wait=False)


def lease(job_id: str) -> pb.Lease:
    ref = pb.LeaseRef(job_id=job_id, token=f"token-{job_id}", shard=0)
    return pb.Lease(ref=ref, type="slow", attempt=1, max_attempts=5, lease_ttl_ms=60_000)


async def test_the_wait_for_a_thread_is_not_part_of_the_budget(worker):
    worker._start(lease("first"), ADDRESS)
    worker._start(lease("second"), ADDRESS)
    await wait_for(lambda: not worker._running, timeout=15)
    nacks = [(n.lease.job_id, n.error) for link in worker._links.values() for n in link.nacks]
    assert nacks == []
    assert sorted(a.lease.job_id for link in worker._links.values() for a in link.acks) == ["first", "second"]
