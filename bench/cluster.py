"""shardq on a Redis Cluster of 3 and of 6 masters: how the shards spread over the masters, and what
each master carries per job when the load grows with the masters.

    python -m bench.cluster [--masters 3,6] [--shards 64] [--jobs 60000] [--processes 2]

For each cluster size: a loopback Redis Cluster (no replicas, no persistence), a fresh PostgreSQL
database and ``dispatcher run`` on ``redis+cluster://``. One job type per shard (names picked so
every shard has exactly one), so each shard carries the same load and a master's share is its
shards' share. Then:

1. where the shards are: the master that holds each shard's slot (``{sN}``), and the spread of
   the 256, 1024 and 4096 shard counts as well (computed from the same slot map);
2. ingest: ``--jobs`` jobs enqueued in batches (no worker yet), and per master the growth of
   ``used_memory``, the commands processed and the CPU time (INFO) over the phase;
3. drain: a no-op worker runs them all; the same per master.

Every figure is per master and as a ratio to the mean over masters (1.00 is an even spread). On a
2-core machine the jobs/s are bounded by the CPU the dispatcher, PostgreSQL and the worker share
with the masters, not by Redis: compare the per-master costs (CPU-ms and commands per 1,000 jobs)
and the spread, which do not depend on that.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import redis
from redis.crc import key_slot

from dispatcher.queue.keys import ShardKeys
from shardmap import shard_for
from tests.support.processes import ROOT, _env
from tests.support.redis_cluster import RedisCluster3
from worker_sdk import AsyncClient, Client

from .infra.dispatcher import Dispatcher
from .infra.postgres import Postgres

BATCH = 1000
IN_FLIGHT = 4


def types_one_per_shard(shards: int) -> list[str]:
    found: dict[int, str] = {}
    i = 0
    while len(found) < shards:
        name = f"bench.c{i}"
        found.setdefault(shard_for(name, shards), name)
        i += 1
    return [found[s] for s in range(shards)]


def spread(owners: dict[int, int], shards: int) -> dict[int, int]:
    """Shards per master port."""
    per: dict[int, int] = {port: 0 for port in set(owners.values())}
    for shard in range(shards):
        per[owners[key_slot(ShardKeys(shard).meta.encode())]] += 1
    return per


def _info(ports: list[int]) -> dict[int, dict[str, float]]:
    out = {}
    for port in ports:
        with redis.Redis(port=port) as r:
            info = r.info()
            out[port] = {
                "memory": float(info["used_memory"]) - float(info.get("mem_clients_normal", 0)),
                "commands": float(info["total_commands_processed"]),
                "cpu": float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
            }
    return out


def _pg(db_url: str) -> dict[str, float]:
    """The WAL written and the transactions committed so far (the whole server's: nothing else runs
    on a benchmark's database server while it measures, or the figures say more than shardq's)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, "
            "(SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())"
        ).fetchone()
    assert row is not None
    return {"wal": float(row[0]), "commits": float(row[1])}


def _delta(after: dict, before: dict) -> dict[int, dict[str, float]]:
    return {p: {k: after[p][k] - before[p][k] for k in after[p]} for p in after}


def _row(name: str, values: list[float], fmt: str) -> str:
    mean = statistics.fmean(values)
    cells = " | ".join(format(v, fmt) for v in values)
    ratios = f"{min(values) / mean:.2f}-{max(values) / mean:.2f}" if mean else "-"
    return f"| {name} | {cells} | {ratios} |"


async def _enqueue(target: str, types: list[str], jobs: int) -> float:
    """``jobs`` spread evenly over the types, in batches of one type (one call to its owner each)."""
    per_type = jobs // len(types)
    batches = [(t, min(BATCH, per_type - done)) for t in types for done in range(0, per_type, BATCH)]
    began = time.perf_counter()
    async with AsyncClient(target, route=True, timeout=60) as client:
        sem = asyncio.Semaphore(IN_FLIGHT)

        async def one(job_type: str, count: int) -> None:
            async with sem:
                await client.enqueue_many([{"type": job_type, "payload": b"x" * 32}] * count)

        await asyncio.gather(*(one(t, n) for t, n in batches))
    return time.perf_counter() - began


def _pending(target: str) -> int:
    with Client(target, timeout=30) as client:
        return sum(q.ready + q.leased + q.delayed for q in client.stats())


def measure(masters: int, shards: int, jobs: int, processes: int, workdir: Path) -> None:
    cluster = RedisCluster3(workdir / f"cluster{masters}", masters=masters)
    cluster.start()
    postgres = Postgres(private=True).start()  # its WAL is shardq's alone
    database = postgres.new_database()
    dispatcher = Dispatcher(
        cluster.url, database.url, workdir / f"logs{masters}", processes, shard_count=shards
    )
    worker = None
    try:
        dispatcher.start()
        owners = cluster.slot_owners()
        ports = sorted(set(owners.values()))
        print(f"\n== {masters} masters, {shards} shards, {processes} dispatcher processes, {jobs:,} jobs")
        for count in sorted({shards, 256, 1024, 4096}):
            per = spread(owners, count)
            values = [per[p] for p in ports]
            print(
                f"   {count:>5} shards per master: {values}  "
                f"(max/mean {max(values) / statistics.fmean(values):.2f})"
            )
        types = types_one_per_shard(shards)
        jobs = jobs // shards * shards
        before, pg_before = _info(ports), _pg(database.url)
        ingest_s = asyncio.run(_enqueue(dispatcher.target, types, jobs))
        deadline = time.monotonic() + 120
        while _pending(dispatcher.target) < jobs and time.monotonic() < deadline:
            time.sleep(0.2)
        ingest, pg_ingest = _delta(_info(ports), before), _pg(database.url)
        before = _info(ports)
        began = time.perf_counter()
        worker = subprocess.Popen(
            [sys.executable, "-m", "bench.noop_worker", "--target", dispatcher.target,
             "--types", ",".join(types), "--concurrency", "1024"],
            cwd=ROOT, env=_env({}), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 600
        while _pending(dispatcher.target) > 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        drain_s = time.perf_counter() - began
        drain, pg_drain = _delta(_info(ports), before), _pg(database.url)
        per = spread(owners, shards)
        print(
            f"   ingest {jobs / ingest_s:,.0f} jobs/s, drain {jobs / drain_s:,.0f} jobs/s "
            "(all masters together)"
        )
        header = " | ".join(f"master {i + 1}" for i in range(len(ports)))
        print(f"\n   | per master | {header} | min-max / mean |")
        print("   | --- |" + " ---: |" * (len(ports) + 1))
        k = jobs / 1000
        rows = [
            _row("shards", [per[p] for p in ports], "d"),
            _row("memory after ingest, MB", [ingest[p]["memory"] / 1e6 for p in ports], ".1f"),
            _row("ingest: commands per 1k jobs", [ingest[p]["commands"] / k for p in ports], ",.0f"),
            _row("ingest: CPU-ms per 1k jobs", [ingest[p]["cpu"] * 1000 / k for p in ports], ".1f"),
            _row("drain: commands per 1k jobs", [drain[p]["commands"] / k for p in ports], ",.0f"),
            _row("drain: CPU-ms per 1k jobs", [drain[p]["cpu"] * 1000 / k for p in ports], ".1f"),
        ]
        for row in rows:
            print("   " + row)
        print(
            f"   PostgreSQL: WAL {(pg_ingest['wal'] - pg_before['wal']) / jobs:,.0f} B/job at ingest, "
            f"{(pg_drain['wal'] - pg_ingest['wal']) / jobs:,.0f} B/job at drain; commits per 1k jobs "
            f"{(pg_ingest['commits'] - pg_before['commits']) / k:,.1f} at ingest, "
            f"{(pg_drain['commits'] - pg_ingest['commits']) / k:,.1f} at drain "
            "(a private server; fsync off, which changes no byte of WAL)"
        )
        total_cpu = sum(drain[p]["cpu"] for p in ports)
        print(
            f"   drain: all masters' CPU {total_cpu * 1000 / k:.1f} ms per 1k jobs; "
            f"busiest master {max(drain[p]['cpu'] for p in ports) / drain_s * 100:.0f}% of a core"
        )
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(timeout=30)
        dispatcher.stop()
        database.drop()
        postgres.stop()
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--masters", default="3,6")
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--jobs", type=int, default=60_000)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as workdir:
        for masters in (int(m) for m in args.masters.split(",")):
            measure(masters, args.shards, args.jobs, args.processes, Path(workdir))


if __name__ == "__main__":
    main()
