"""Dramatiq's driver: ``send``/``send_with_options(delay=…)`` per job; Dramatiq has no bulk send,
so a batch is a loop of sends. Workers: ``dramatiq`` with 2 processes of 8 threads (its default)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from . import _driver
from ._probe import REDIS_URL_ENV, job_started

THREADS = 8

dramatiq.set_broker(RedisBroker(url=os.environ.get(REDIS_URL_ENV, "redis://127.0.0.1:6379/0")))


@dramatiq.actor(actor_name="noop", max_retries=0)
def noop(seq: int, t_enqueued: float, run_at: float) -> None:
    job_started(seq, t_enqueued, run_at)


class DramatiqAdapter(_driver.Adapter):
    packages = ("dramatiq", "redis")
    settings = {"threads_per_process": THREADS, "bulk": "send in a loop (no bulk API)"}

    async def enqueue(self, job: _driver.Job) -> None:
        if job.run_at:
            delay_ms = max(0, round((job.run_at - time.time()) * 1000))
            noop.send_with_options(args=tuple(job), delay=delay_ms)
        else:
            noop.send(*job)

    async def enqueue_batch(self, jobs: list[_driver.Job]) -> None:
        for job in jobs:
            await self.enqueue(job)

    def worker_commands(self, processes: int) -> list[list[str]]:
        cli = str(Path(sys.executable).with_name("dramatiq"))
        return [[cli, "bench.peers.dramatiq", "--processes", str(processes), "--threads", str(THREADS)]]


if __name__ == "__main__":
    _driver.main(DramatiqAdapter)
