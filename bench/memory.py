"""Redis memory per pending job, measured through a real dispatcher.

    python -m bench.memory [--jobs 100000] [--types 4] [--payload-bytes 0] [--delayed]

Starts a throwaway redis-server on a free port and one dispatcher process (SQLite in a temporary
folder), waits until it owns every shard, reads INFO memory used_memory, enqueues the jobs through
the gRPC API in batches of 1,000 with no worker connected (so they stay ready, or delayed with
--delayed), waits until Redis counts every one of them, reads used_memory again and prints the
difference divided by the number of jobs: the cost of a pending job, payload included, in queues
large enough (over 128 jobs per shard and per ready set) for Redis' hashtable and skiplist encodings.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis

from dispatcher.ops.embedded import EmbeddedRedis
from dispatcher.queue.keys import ShardKeys
from worker_sdk import Client


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _used_memory(r: redis.Redis) -> int:
    """used_memory less the clients' buffers, as the benchmark's memory scenario measures it."""
    memory = r.info("memory")
    return int(memory["used_memory"]) - int(memory.get("mem_clients_normal", 0))


def _wait(condition: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def _pending(r: redis.Redis, shards: int) -> int:
    """Jobs Redis counts as ready or delayed, from every shard's counts hash."""
    total = 0
    for shard in range(shards):
        for field, value in r.hgetall(ShardKeys(shard).counts).items():
            if str(field).rsplit("|", 1)[1] in ("ready", "delayed"):
                total += int(value)
    return total


def measure(jobs: int, types: int, payload_bytes: int, delayed: bool, shards: int = 64) -> dict[str, int]:
    tmp = tempfile.mkdtemp(prefix="shardq-memory-")
    server = EmbeddedRedis()
    asyncio.run(server.start())
    target = f"127.0.0.1:{_free_port()}"
    env = {
        **os.environ,
        "SHARDQ_REDIS_URL": server.url,
        "SHARDQ_DB_URL": f"sqlite:///{tmp}/memory.sqlite3",
        "SHARDQ_LISTEN": target,
        "SHARDQ_PROCESSES": "1",
        "SHARDQ_SHARD_COUNT": str(shards),
        "SHARDQ_METRICS_LISTEN": "",
        "SHARDQ_LOG_LEVEL": "warning",
    }
    log = open(Path(tmp) / "dispatcher.log", "wb")  # noqa: SIM115
    dispatcher = subprocess.Popen(
        [sys.executable, "-m", "dispatcher.cli.daemon", "run"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp,
    )
    r = redis.Redis(port=server.port, decode_responses=True)
    try:
        # Measure from a settled cluster: every shard's meta, membership and counters exist.
        _wait(
            lambda: all(r.hget(ShardKeys(s).meta, "owner") for s in range(shards)),
            "the dispatcher did not take every shard",
            60,
        )
        before = _used_memory(r)
        payload = b"x" * payload_bytes
        names = [f"bench.type{i}" for i in range(types)]
        options = {"delay": 86400} if delayed else {}
        with Client(target) as client:
            for start in range(0, jobs, 1000):
                client.enqueue_many(
                    [
                        {"type": names[i % types], "payload": payload, **options}
                        for i in range(start, min(jobs, start + 1000))
                    ]
                )
        # Enqueue returns once the DB committed; the working set follows right after.
        _wait(lambda: _pending(r, shards) == jobs, "Redis did not count every job", 120)
        after = _used_memory(r)
        return {
            "jobs": jobs,
            "payload_bytes": payload_bytes,
            "used_memory_before": before,
            "used_memory_after": after,
            "bytes_per_pending_job": round((after - before) / jobs),
        }
    finally:
        r.close()
        dispatcher.terminate()
        dispatcher.wait(30)
        log.close()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--types", type=int, default=4)
    parser.add_argument("--payload-bytes", type=int, default=0, help="size of each job's payload")
    parser.add_argument("--delayed", action="store_true", help="delayed jobs (a day ahead) instead of ready")
    args = parser.parse_args()
    result = measure(args.jobs, args.types, args.payload_bytes, args.delayed)
    for key, value in result.items():
        print(f"{key:22} {value:>12}")


if __name__ == "__main__":
    main()
