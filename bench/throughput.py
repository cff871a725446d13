"""End-to-end throughput of one dispatcher process with two worker processes, no-op jobs.

    python -m bench.throughput [--jobs 10000] [--types 4] [--db sqlite|postgres URL] [--workers 2]

Starts a private redis-server and a dispatcher (SQLite in a temp dir unless --db is a URL), enqueues
the jobs in batches of 1,000 before any worker runs (ingest), then starts the workers and times until
every job is acked (drain). Prints jobs/s for both phases and the dispatcher's CPU time per job.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from dispatcher.ops.embedded import EmbeddedRedis
from worker_sdk import AsyncClient

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _ready(target: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        client = AsyncClient(target, timeout=1)
        try:
            await client.version()
            return
        except Exception:
            await asyncio.sleep(0.1)
        finally:
            await client.close()
    raise TimeoutError("dispatcher did not start")


def _dispatcher_cpu(pid: int) -> float:
    """User + system CPU seconds of the dispatcher process and, under a supervisor, its children."""
    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


async def run(
    jobs: int, types: int, db: str, workers: int, concurrency: int, processes: int = 1
) -> dict[str, float]:
    tmp = tempfile.mkdtemp(prefix="shardq-bench-")
    redis = EmbeddedRedis()
    await redis.start()
    port = _free_port()
    target = f"127.0.0.1:{port}"
    env = {
        **os.environ,
        "SHARDQ_REDIS_URL": redis.url,
        "SHARDQ_LISTEN": target,
        "SHARDQ_LOG_LEVEL": "warning",
        "SHARDQ_DB_URL": db if db != "sqlite" else f"sqlite:///{tmp}/bench.sqlite3",
    }
    log = open(Path(tmp) / "dispatcher.log", "wb")  # noqa: SIM115
    dispatcher = subprocess.Popen(
        [sys.executable, "-m", "dispatcher.cli.daemon", "run"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp,
    )
    procs: list[subprocess.Popen[bytes]] = []
    try:
        await _ready(target)
        client = AsyncClient(target)
        names = [f"noop{i}" for i in range(types)]
        cpu0 = _dispatcher_cpu(dispatcher.pid)
        t0 = time.perf_counter()
        for start in range(0, jobs, 1000):
            await client.enqueue_many(
                [{"type": names[i % types]} for i in range(start, min(jobs, start + 1000))]
            )
        ingest = time.perf_counter() - t0
        t1 = time.perf_counter()
        for _ in range(workers):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "bench.noop_worker",
                        "--target",
                        target,
                        "--types",
                        ",".join(names),
                        "--concurrency",
                        str(concurrency),
                    ],
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        while True:
            stats = await client.stats()
            if sum(q.ready + q.leased + q.delayed for q in stats) == 0:
                break
            await asyncio.sleep(0.02)
        drain = time.perf_counter() - t1
        cpu_s = _dispatcher_cpu(dispatcher.pid) - cpu0
        await client.close()
        return {
            "jobs": jobs,
            "ingest_jobs_per_s": jobs / ingest,
            "drain_jobs_per_s": jobs / drain,
            "end_to_end_jobs_per_s": jobs / (ingest + drain),
            "dispatcher_cpu_ms_per_job": cpu_s * 1000 / jobs,
        }
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
        dispatcher.terminate()
        dispatcher.wait(20)
        log.close()
        redis.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--types", type=int, default=4)
    parser.add_argument("--db", default="sqlite", help="sqlite, or a postgresql:// URL of an empty database")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--processes", type=int, default=1, help="dispatcher processes (>1: a supervisor)")
    args = parser.parse_args()
    import uvloop

    result = uvloop.run(run(args.jobs, args.types, args.db, args.workers, args.concurrency, args.processes))
    for key, value in result.items():
        print(f"{key:28} {value:12.2f}")


if __name__ == "__main__":
    main()
