"""What flow control costs: a drain with per-key limits against one without, and the lease script's
throughput with few against very many concurrency keys.

    python -m bench.flow_control [--jobs 50000] [--keys 1000] [--rounds 2] [--lease-jobs 200000]

1. Drain: a private redis-server, a fresh PostgreSQL database and a 2-process dispatcher (as
   ``python -m bench run``). Per round, ``--jobs`` no-op jobs of a plain type are queued with no
   worker connected, then one worker (concurrency 1024) drains them; then as many of a type with a
   per-key limit of 2 whose jobs spread over ``--keys`` concurrency keys. jobs/s is from the worker's
   start to the type's last job done. Rounds alternate the two, so the ratio is of one run.
2. Lease throughput: the lease script alone (WorkingSet.lease, 64 picks a call) on a private
   redis-server, draining ``--lease-jobs`` ready jobs spread over 10 keys, then over 100,000 keys (and
   with no key, for reference), each type with a per-key limit too high to bind, so every check runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .infra.redis_server import PrivateRedis
from .infra.stack import shardq_stack

ROOT = Path(__file__).resolve().parents[1]
WORKER_CONCURRENCY = 1024
KEY_LIMIT = 2


def _drain(target: str, job_type: str, jobs: int, keys: int) -> float:
    """Queue the jobs with no worker, start one, and return jobs/s until the type has none left."""
    from worker_sdk import Client

    with Client(target, route=True) as client:
        if keys:
            client.set_queue_settings(job_type, key_concurrency=KEY_LIMIT)
        for start in range(0, jobs, 5000):
            count = min(5000, jobs - start)
            specs = [
                {"type": job_type, **({"concurrency_key": f"key-{(start + i) % keys}"} if keys else {})}
                for i in range(count)
            ]
            client.enqueue_many(specs)
        env = {**os.environ, "SHARDQ_LOG_LEVEL": "warning"}
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        argv = [sys.executable, "-m", "bench.noop_worker", "--target", target, "--types", job_type,
                "--concurrency", str(WORKER_CONCURRENCY)]  # fmt: skip
        began = time.perf_counter()
        worker = subprocess.Popen(argv, env=env)
        try:
            while True:
                q = client.get_queue(job_type)
                if q.delayed + q.ready + q.running == 0:
                    return jobs / (time.perf_counter() - began)
                time.sleep(0.02)
        finally:
            worker.terminate()
            worker.wait(30)


def drain_rows(jobs: int, keys: int, rounds: int) -> list[tuple[str, float]]:
    logs = Path(tempfile.mkdtemp(prefix="shardq-flow-bench-"))
    rows = []
    with shardq_stack(logs / "dispatcher") as stack:
        for n in range(rounds):
            plain = _drain(stack.dispatcher.target, f"plain{n}", jobs, 0)
            keyed = _drain(stack.dispatcher.target, f"keyed{n}", jobs, keys)
            rows.append((f"round {n + 1}", keyed / plain))
            print(
                f"drain round {n + 1}: no limits {plain:,.0f} jobs/s; per-key limit {KEY_LIMIT} over "
                f"{keys:,} keys {keyed:,.0f} jobs/s; ratio {keyed / plain:.2f}",
                flush=True,
            )
    shutil.rmtree(logs, ignore_errors=True)
    return rows


async def _lease_rate(redis_url: str, jobs: int, keys: int) -> tuple[float, float]:
    """(leases/s as the caller sees them, µs of Redis's time in the lease script per lease)."""
    import redis.asyncio as aredis

    from dispatcher.queue.flow import QueueSettings
    from dispatcher.queue.keys import ShardKeys
    from dispatcher.queue.records import JobRecord
    from dispatcher.queue.states import JobState, Priority
    from dispatcher.queue.working_set import NewJob, WorkingSet

    client = aredis.Redis.from_url(redis_url)
    try:
        await client.flushall()
        ws = WorkingSet(client)
        shard, now, job_type = 1, 1_700_000_000_000, "leased"
        await ws.acquire(shard, 1, "bench", now, now + 3_600_000)
        # A limit that never binds: every lease still reads and counts the key's running jobs.
        settings = QueueSettings(job_type, key_concurrency=1_000_000 if keys else 0)
        await client.hset(ShardKeys(shard).flow, job_type, settings.pack())
        for start in range(0, jobs, 5000):
            batch = []
            for i in range(start, min(jobs, start + 5000)):
                key = f"key-{i % keys}" if keys else ""
                record = JobRecord(
                    job_type, Priority.DEFAULT, JobState.READY, now, now, 5, 60_000, concurrency_key=key
                )
                batch.append(NewJob(f"job-{i}", record, b""))
            await ws.enqueue(shard, 1, now, batch)
        leased = 0
        await client.config_resetstat()
        began = time.perf_counter()
        while leased < jobs:
            got = (await ws.lease(shard, 1, now, [job_type], [1] * 64)).grants
            if not got:
                raise RuntimeError(f"only {leased} of {jobs} jobs leased")
            leased += len(got)
        elapsed = time.perf_counter() - began
        script = (await client.info("commandstats"))["cmdstat_evalsha"]
        return jobs / elapsed, script["usec"] / jobs
    finally:
        await client.aclose()


def lease_rows(jobs: int) -> None:
    server = PrivateRedis().start()
    try:
        rates = {keys: asyncio.run(_lease_rate(server.url, jobs, keys)) for keys in (0, 10, 100_000)}
    finally:
        server.stop()
    for keys, (rate, script_us) in rates.items():
        print(
            f"lease throughput, {jobs:,} ready jobs over {keys:,} keys, 64 a call: {rate:,.0f} leases/s, "
            f"{script_us:.1f} µs of Redis's time per lease",
            flush=True,
        )
    (few, few_us), (many, many_us) = rates[10], rates[100_000]
    print(
        f"lease throughput 100,000 keys / 10 keys: {many / few:.2f} (by Redis's time per lease "
        f"{few_us / many_us:.2f}); 10 keys / no key: {few / rates[0][0]:.2f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lease-jobs", type=int, default=200_000)
    parser.add_argument("--skip-drain", action="store_true", help="only the lease throughput")
    args = parser.parse_args()
    lease_rows(args.lease_jobs)
    if not args.skip_drain:
        drain_rows(args.jobs, args.keys, args.rounds)


if __name__ == "__main__":
    main()
