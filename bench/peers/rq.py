"""RQ's driver: ``enqueue``/``enqueue_at`` per job, ``enqueue_many`` (one pipeline) per batch.
Workers are ``SimpleWorker`` (no fork per job: RQ's fastest), with the scheduler for delayed jobs; a
SimpleWorker runs one job at a time, so its concurrency is the number of worker processes. Jobs name
their function as a string: the driver runs as __main__, the workers import this module."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime

from redis import Redis
from rq import Queue, SimpleWorker

from . import _driver, _work
from ._probe import REDIS_URL_ENV, job_started

FUNCTION = "bench.peers.rq.job"
# SimpleWorker processes, per kind of work: 2 (one per core) for no-op jobs. `python -m bench sweep
# --system rq --work WORK` (drain of 20,000 or 15 s, best of 2 rounds in turns): redis 2 -> 535 jobs/s,
# 4 -> 633, 8 -> 553, 16 -> 480; io1ms 2 -> 459, 4 -> 581, 8 -> 579, 16 -> 497; cpu100us 2 -> 535,
# 4 -> 624, 8 -> 565.
WORKERS = {"noop": 2, "redis": 4, "io1ms": 4, "cpu100us": 4}

WORK = _work.sync_work(1)


def job(seq: int, t_enqueued: float, run_at: float) -> None:
    job_started(seq, t_enqueued, run_at)
    if WORK is not None:
        WORK(seq)


def queue() -> Queue:
    return Queue("bench", connection=Redis.from_url(os.environ[REDIS_URL_ENV]))


class RqAdapter(_driver.Adapter):
    packages = ("rq", "redis")
    settings = {"worker_class": "SimpleWorker", "with_scheduler": True, "bulk": "Queue.enqueue_many"}
    concurrency = WORKERS
    concurrency_means = "SimpleWorker processes (each runs one job at a time)"

    async def open(self) -> None:
        self.queue = queue()

    async def enqueue(self, job: _driver.Job) -> None:
        if job.run_at:
            self.queue.enqueue_at(datetime.fromtimestamp(job.run_at, UTC), FUNCTION, *job)
        else:
            self.queue.enqueue(FUNCTION, *job)

    async def enqueue_batch(self, jobs: list[_driver.Job]) -> None:
        if any(job.run_at for job in jobs):  # enqueue_many has no due time
            for job in jobs:
                await self.enqueue(job)
            return
        self.queue.enqueue_many([Queue.prepare_data(FUNCTION, args=tuple(job)) for job in jobs])

    def worker_commands(self, processes: int) -> list[list[str]]:
        return [[sys.executable, "-m", "bench.peers.rq", "worker"] for _ in range(self.worker_concurrency)]


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        q = queue()
        SimpleWorker([q], connection=q.connection).work(with_scheduler=True, logging_level="WARNING")
    else:
        _driver.main(RqAdapter)
