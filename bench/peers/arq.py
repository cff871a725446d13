"""arq's driver: ``enqueue_job`` per job; arq has no bulk API, so a batch is concurrent
``enqueue_job`` calls on one pool (what its docs suggest). Workers poll every 10 ms (the 0.5 s
default would dominate every latency) and run up to ``max_jobs`` jobs each (MAX_JOBS)."""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import UTC, datetime
from typing import Any

from arq import create_pool
from arq.connections import RedisSettings
from arq.worker import run_worker

from . import _driver, _work
from ._probe import REDIS_URL_ENV, job_started

POLL_DELAY_S = 0.01
# max_jobs per worker process, per kind of work. arq's own cost per job bounds it whatever the
# concurrency; `python -m bench sweep --system arq --work WORK` (drain of 20,000, best of 2-3 rounds in
# turns): redis 16 -> 1.89K jobs/s, 64 -> 1.89K, 128 -> 1.92K, 256 -> 1.92K; io1ms 32 -> 1.86K,
# 64 -> 1.88K, 128 -> 1.90K, 256 -> 1.90K; cpu100us 16 -> 1.81K, 64 -> 1.78K, 128 -> 1.87K.
MAX_JOBS = {"noop": 64, "redis": 256, "io1ms": 128, "cpu100us": 128}


def redis_settings() -> RedisSettings:
    return RedisSettings.from_dsn(os.environ[REDIS_URL_ENV])


WORK = _work.async_work(_work.concurrency(MAX_JOBS))


async def job(ctx: dict[str, Any], seq: int, t_enqueued: float, run_at: float) -> None:
    job_started(seq, t_enqueued, run_at)
    if WORK is not None:
        await WORK(seq)


class WorkerSettings:
    functions = [job]
    poll_delay = POLL_DELAY_S
    max_jobs = _work.concurrency(MAX_JOBS)


class ArqAdapter(_driver.Adapter):
    packages = ("arq", "redis")
    settings = {"poll_delay_s": POLL_DELAY_S, "bulk": "asyncio.gather of enqueue_job (no bulk API)"}
    concurrency = MAX_JOBS
    concurrency_means = "max_jobs of each worker process"

    async def open(self) -> None:
        self.pool = await create_pool(redis_settings())

    async def close(self) -> None:
        await self.pool.aclose()

    async def enqueue(self, job: _driver.Job) -> None:
        defer = datetime.fromtimestamp(job.run_at, UTC) if job.run_at else None
        await self.pool.enqueue_job("job", *job, _defer_until=defer)

    async def enqueue_batch(self, jobs: list[_driver.Job]) -> None:
        await asyncio.gather(*(self.enqueue(job) for job in jobs))

    def worker_commands(self, processes: int) -> list[list[str]]:
        return [[sys.executable, "-m", "bench.peers.arq", "worker"] for _ in range(processes)]


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        WorkerSettings.redis_settings = redis_settings()  # type: ignore[attr-defined]
        run_worker(WorkerSettings)  # type: ignore[arg-type]
    else:
        _driver.main(ArqAdapter)
