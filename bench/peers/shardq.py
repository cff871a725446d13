"""shardq's driver: ``AsyncClient`` with ``route=True`` (one call per job, ``enqueue_many`` per
batch) and ``worker_sdk.serve`` workers with an async handler. Runs in the project's own environment;
the harness starts the dispatcher and passes its address in SHARDQ_TARGET.

Jobs are spread over BENCH_JOB_TYPES types (default 8), as an application's many job types are, so
they land on several shards and every dispatcher process has work.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from . import _driver, _work
from ._probe import job_started

# Per kind of work. Leases and results travel in batches of about a quarter of a worker's concurrency
# (README), and a deeper pipeline amortizes every stage's fixed cost. No-op drain of 60,000, 2
# dispatcher processes: 256 -> 13.2-13.8K jobs/s, 512 -> 16.6K, 1,024 -> 19.2-21.1K, 2,048 -> 18.8-19.4K.
# `python -m bench sweep --system shardq --work WORK` (drain of 20,000, best of 2-3 rounds in turns):
# redis 128 -> 5.2K, 256 -> 6.6K, 512 -> 7.7K, 1,024 -> 7.8K, 2,048 -> 6.4K; io1ms 256 -> 11.5K,
# 512 -> 16.0K, 1,024 -> 19.7-20.4K, 2,048 -> 21.8-23.5K, 4,096 -> 22.2K; cpu100us 256 -> 8.6K,
# 512 -> 9.5K, 1,024 -> 9.6K.
CONCURRENCY = {"noop": 1024, "redis": 1024, "io1ms": 2048, "cpu100us": 1024}


def job_types() -> list[str]:
    return [f"noop{i}" for i in range(int(os.environ.get("BENCH_JOB_TYPES", "8")))]


class ShardqAdapter(_driver.Adapter):
    packages = ("shardq", "grpcio", "protobuf", "redis")

    def __init__(self) -> None:
        self.types = job_types()
        self.settings = {"client": "AsyncClient(route=True) (one call per job, enqueue_many per batch)",
                         "job_types": len(self.types)}  # fmt: skip
        self.concurrency = CONCURRENCY
        self.client: Any = None

    async def open(self) -> None:
        from worker_sdk import AsyncClient

        self.client = AsyncClient(os.environ["SHARDQ_TARGET"], route=True)  # the bench reaches every process

    async def close(self) -> None:
        await self.client.close()

    def _spec(self, job: _driver.Job) -> dict[str, Any]:
        spec: dict[str, Any] = {"type": self.types[job.seq % len(self.types)],
                                "payload": {"s": job.seq, "e": job.t_enqueued, "r": job.run_at}}  # fmt: skip
        if job.run_at:
            spec["run_at"] = job.run_at
        return spec

    async def enqueue(self, job: _driver.Job) -> None:
        spec = self._spec(job)
        await self.client.enqueue(spec.pop("type"), spec.pop("payload"), **spec)

    async def enqueue_batch(self, jobs: list[_driver.Job]) -> None:
        await self.client.enqueue_many([self._spec(job) for job in jobs])

    def worker_commands(self, processes: int) -> list[list[str]]:
        return [[sys.executable, "-m", "bench.peers.shardq", "worker"] for _ in range(processes)]


def run_worker() -> None:
    from worker_sdk import serve

    concurrency = _work.concurrency(CONCURRENCY)
    work = _work.async_work(concurrency)

    async def handle(ctx: Any) -> None:
        payload = json.loads(ctx.payload)
        job_started(payload["s"], payload["e"], payload["r"])
        if work is not None:
            await work(payload["s"])

    serve({name: handle for name in job_types()}, concurrency=concurrency, shutdown_grace=2)


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        run_worker()
    else:
        _driver.main(ShardqAdapter)
