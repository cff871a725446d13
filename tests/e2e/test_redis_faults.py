"""Redis answering with errors, and Redis failing over, under a running dispatcher.

A reachable Redis can refuse writes for a while: READONLY (a failover demoted the server a connection
reaches), OOM (maxmemory reached under noeviction), MISCONF, NOREPLICAS, BUSY. Every long-lived loop
backs off and goes on, and a worker stream whose message met such an error is closed with UNAVAILABLE,
so its worker reconnects. A failover to a replica that missed the last writes (replication is
asynchronous) is noticed at once, and the jobs the new master lacks are restored from the DB."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from dispatcher.queue.keys import ShardKeys
from shardmap import shard_for
from shardq_common.pb import shardq_pb2 as pb
from tests.e2e.conftest import TEST_SETTINGS
from tests.support.processes import events
from tests.support.raw_worker import RawWorker
from tests.support.redis_server import RedisServer
from tests.support.tcp_proxy import TcpProxy
from tests.support.wait import wait_for
from worker_sdk import AsyncClient

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)

# (command that starts the fault, command that ends it): every write is refused in between.
FAULTS = {
    "readonly": (("REPLICAOF", "127.0.0.1", "1"), ("REPLICAOF", "NO", "ONE")),
    "oom": (("CONFIG", "SET", "maxmemory", "1"), ("CONFIG", "SET", "maxmemory", "0")),
}
OUTAGE_S = 2.0


async def stream_end(worker: RawWorker, timeout: float) -> grpc.StatusCode | None:
    """How the dispatcher ended the worker's stream within ``timeout`` s (None: it did not)."""
    try:
        async with asyncio.timeout(timeout):
            while (await worker.call.read()) is not grpc.aio.EOF:
                pass
        return grpc.StatusCode.OK
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    except TimeoutError:
        return None


async def has_status(client: AsyncClient, job_id: str, expected: str) -> bool:
    return (await client.get_job(job_id)).status == expected


async def queued(client: AsyncClient, expected: int) -> bool:
    """Whether Redis holds ``expected`` jobs waiting (ready or delayed)."""
    return sum(s.ready + s.delayed for s in await client.stats()) == expected


def starts(ledger: Path, job_id: str) -> int:
    return sum(1 for e in events(ledger, "start") if e["job"] == job_id)


@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_loops_and_worker_streams_outlive_redis_refusing_writes(
    fault, start_dispatcher, private_redis, db_url, start_worker, ledger
):
    shards = TEST_SETTINGS["shard_count"]
    proc = start_dispatcher(private_redis.url, db_url)
    client = AsyncClient(proc.target, timeout=30)
    holder = RawWorker(proc.target)
    redis = private_redis.client()
    try:
        # A lease a hand-driven worker holds across the outage, and acks after it.
        held_job = await client.enqueue("held_fault", None)
        await holder.hello("holder", ["held_fault"])
        await holder.credit(1)
        lease = (await holder.next_of("leases")).leases[0]
        assert lease.ref.job_id == held_job

        # A worker SIGKILLed while running a job: its lease is cut to the reconnect grace (1 s), so
        # the shard's reaper expires it during the outage.
        killed_job = await client.enqueue("sleep_fault", {"sleep": 60, "sleep_attempts": 1})
        victim = start_worker(proc.target, types="sleep_fault", concurrency=1)
        await wait_for(lambda: starts(ledger, killed_job) == 1, timeout=20)
        leased_key = ShardKeys(shard_for("sleep_fault", shards)).leased
        full_deadline = redis.zscore(leased_key, killed_job)
        assert full_deadline is not None
        victim.kill()
        await wait_for(
            lambda: (redis.zscore(leased_key, killed_job) or full_deadline) < full_deadline - 30_000,
            timeout=10,
            message="the killed worker's lease was not cut to the reconnect grace",
        )

        # A delayed job that falls due during the outage: its promotion meets the refusal first.
        delayed_job = await client.enqueue("noop_fault", None, delay=1.0)

        redis.execute_command(*FAULTS[fault][0])
        outage_began = time.monotonic()
        try:
            await holder.send(heartbeat=pb.Heartbeat(leases=[lease.ref]))
            ended = await stream_end(holder, timeout=OUTAGE_S - 0.2)
            await asyncio.sleep(max(0.0, outage_began + OUTAGE_S - time.monotonic()))  # the outage itself
        finally:
            redis.execute_command(*FAULTS[fault][1])
        assert ended is grpc.StatusCode.UNAVAILABLE, (
            f"the worker stream whose heartbeat met the refusal was not closed with UNAVAILABLE "
            f"(so its worker does not reconnect): {ended}\n{proc.log_tail(20)}"
        )

        # The worker reconnects, reclaiming its lease, and acks it.
        await holder.close()
        holder = RawWorker(proc.target)
        await holder.hello("holder", ["held_fault"], held=[lease.ref])
        await holder.next_of("extended")
        await holder.ack(lease.ref)
        start_worker(proc.target, types="sleep_fault,noop_fault", concurrency=4)

        for job_id, what in (
            (held_job, "the held lease's ack was not applied"),
            (delayed_job, "the delayed job due during the outage did not run"),
            (killed_job, "the killed worker's job did not run again"),
        ):
            await wait_for(
                lambda job_id=job_id: has_status(client, job_id, "succeeded"),
                timeout=30,
                interval=0.2,
                message=lambda job_id=job_id, what=what: f"{what}:\n{proc.log_tail(25)}",
            )
        assert starts(ledger, killed_job) == 2
        assert starts(ledger, delayed_job) == 1
    finally:
        await holder.close()
        await client.close()
        redis.close()


@pytest.mark.parametrize("old_master", ["killed", "demoted"])
async def test_jobs_a_lagging_replica_lacks_run_soon_after_it_becomes_master(
    old_master, private_redis, tmp_path, start_dispatcher, db_url, start_worker, ledger
):
    """Replication is asynchronous: the replica promoted in a failover can lack the last writes while
    the shards' meta hashes (owner, epoch) survive. The dispatcher, reaching Redis through an address
    that follows the master, notices the new master and restores what it lacks from the DB: every
    accepted job runs within 15 s of the failover (the full sweep is an hour away here)."""
    primary = private_redis
    replica = RedisServer(tmp_path / "replica", extra_args=("--replicaof", primary.host, str(primary.port)))
    replica.start()
    proxy = TcpProxy(primary.port).start()
    client = None
    try:
        with replica.client() as r:
            await wait_for(lambda: r.info("replication").get("master_link_status") == "up", timeout=15)
        proc = start_dispatcher(proxy.url, db_url)
        client = AsyncClient(proc.target, timeout=30)
        types = [f"noop_failover{i}" for i in range(6)]  # several shards
        replicated = await client.enqueue_many([{"type": types[i % 6]} for i in range(30)])
        await wait_for(lambda: queued(client, 30), timeout=15)
        with primary.client() as p:
            assert p.execute_command("WAIT", 1, 5000) == 1, "the replica did not take the first jobs"
        with replica.client() as r:
            r.execute_command("REPLICAOF", "127.0.0.1", "1")  # its link breaks: it hears no more
        missed = await client.enqueue_many([{"type": types[i % 6]} for i in range(30)])
        missed += await client.enqueue_many([{"type": types[i % 6], "delay": 2.0} for i in range(6)])
        await wait_for(lambda: queued(client, 66), timeout=15)

        with replica.client() as r:
            r.execute_command("REPLICAOF", "NO", "ONE")
        if old_master == "killed":
            primary.kill()
            proxy.repoint(replica.port, cut=True)
        else:  # still answering on the connections it has, as a replica of the new master
            proxy.repoint(replica.port, cut=False)
            with primary.client() as p:
                p.execute_command("REPLICAOF", replica.host, str(replica.port))
        failover = time.monotonic()
        start_worker(proc.target, types=",".join(types), concurrency=8)
        everything = set(replicated) | set(missed)

        def not_run() -> set[str]:
            return everything - {e["job"] for e in events(ledger, "end")}

        await wait_for(
            lambda: not not_run(),
            timeout=15,
            interval=0.2,
            message=lambda: (
                f"{len(not_run() & set(missed))} of the {len(missed)} jobs the new master missed and "
                f"{len(not_run() & set(replicated))} others did not run within 15 s of the failover:\n"
                f"{proc.log_tail(20)}"
            ),
        )
        print(f"every job ran {time.monotonic() - failover:.1f} s after the failover")
    finally:
        if client is not None:
            await client.close()
        proxy.stop()
        replica.stop()
