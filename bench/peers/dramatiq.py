"""Dramatiq's driver: ``send``/``send_with_options(delay=…)`` per job; Dramatiq has no bulk send,
so a batch is a loop of sends. Workers: ``dramatiq`` with 2 processes of THREADS threads each."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from . import _driver, _work
from ._probe import REDIS_URL_ENV, job_started

# Threads per worker process, per kind of work: 8 (its default) for no-op jobs. `python -m bench sweep
# --system dramatiq --work WORK` (drain of 20,000, best of 2 rounds in turns): redis 4 -> 2.1K jobs/s,
# 8 -> 3.2K, 16 -> 3.5K, 32 -> 3.8K, 64 -> 3.5K; io1ms 8 -> 3.9K, 16 -> 5.1K, 32 -> 5.1K, 64 -> 5.0K;
# cpu100us 2 -> 1.1K, 4 -> 2.1K, 8 -> 4.0K, 32 -> 4.1K.
THREADS = {"noop": 8, "redis": 32, "io1ms": 32, "cpu100us": 32}

dramatiq.set_broker(RedisBroker(url=os.environ.get(REDIS_URL_ENV, "redis://127.0.0.1:6379/0")))


WORK = _work.sync_work(_work.concurrency(THREADS))


@dramatiq.actor(actor_name="job", max_retries=0)
def actor(seq: int, t_enqueued: float, run_at: float) -> None:
    job_started(seq, t_enqueued, run_at)
    if WORK is not None:
        WORK(seq)


class DramatiqAdapter(_driver.Adapter):
    packages = ("dramatiq", "redis")
    settings = {"bulk": "send in a loop (no bulk API)"}
    concurrency = THREADS
    concurrency_means = "threads of each worker process"

    async def enqueue(self, job: _driver.Job) -> None:
        if job.run_at:
            delay_ms = max(0, round((job.run_at - time.time()) * 1000))
            actor.send_with_options(args=tuple(job), delay=delay_ms)
        else:
            actor.send(*job)

    async def enqueue_batch(self, jobs: list[_driver.Job]) -> None:
        for job in jobs:
            await self.enqueue(job)

    def worker_commands(self, processes: int) -> list[list[str]]:
        cli = str(Path(sys.executable).with_name("dramatiq"))
        threads = ["--threads", str(self.worker_concurrency)]
        return [[cli, "bench.peers.dramatiq", "--processes", str(processes), *threads]]


if __name__ == "__main__":
    _driver.main(DramatiqAdapter)
