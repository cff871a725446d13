"""Celery's driver: ``apply_async`` per job (``eta`` for delayed ones); Celery has no bulk send, so a
batch is ``apply_async`` calls sharing one producer connection. Workers: the prefork pool (its
concurrency is its number of processes), no result backend, gossip/mingle/heartbeat off (they only
add start-up and chatter)."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from pathlib import Path

from celery import Celery

from . import _driver, _work
from ._probe import REDIS_URL_ENV, job_started

PREFETCH_MULTIPLIER = 16
# Prefork processes, per kind of work: 2 (one per core) for no-op jobs. `python -m bench sweep --system
# celery --work WORK` (drain of 20,000 or 15 s, best of 2 rounds in turns): redis 2 -> 1.23K jobs/s,
# 4 -> 1.27K, 8 -> 1.21K, 16 -> 1.20K; io1ms 2 -> 1.12K, 4 -> 1.26K, 8 -> 1.28K, 16 -> 1.26K;
# cpu100us 2 -> 1.28K, 4 -> 1.32K, 8 -> 1.24K.
PROCESSES = {"noop": 2, "redis": 4, "io1ms": 8, "cpu100us": 4}

app = Celery("bench", broker=os.environ.get(REDIS_URL_ENV, "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_ignore_result=True,
    worker_prefetch_multiplier=PREFETCH_MULTIPLIER,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


# Made before the pool forks: its children share the CPU calibration; redis-py opens each child's
# own connection (its pool notices the fork).
WORK = _work.sync_work(1)


@app.task(name="job")
def task(seq: int, t_enqueued: float, run_at: float) -> None:
    job_started(seq, t_enqueued, run_at)
    if WORK is not None:
        WORK(seq)


class CeleryAdapter(_driver.Adapter):
    packages = ("celery", "kombu", "redis")
    settings = {"pool": "prefork", "worker_prefetch_multiplier": PREFETCH_MULTIPLIER,
                "bulk": "apply_async on one producer (no bulk API)"}  # fmt: skip
    concurrency = PROCESSES
    concurrency_means = "prefork pool processes (-c; each runs one job at a time)"

    async def enqueue(self, job: _driver.Job, producer: object = None) -> None:
        eta = datetime.fromtimestamp(job.run_at, UTC) if job.run_at else None
        task.apply_async(tuple(job), eta=eta, producer=producer)

    async def enqueue_batch(self, jobs: list[_driver.Job]) -> None:
        with app.producer_or_acquire() as producer:
            for job in jobs:
                await self.enqueue(job, producer)

    def worker_commands(self, processes: int) -> list[list[str]]:
        celery = str(Path(sys.executable).with_name("celery"))
        quiet = ["--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING"]
        pool = ["--pool", "prefork", "-c", str(self.worker_concurrency)]
        return [[celery, "-A", "bench.peers.celery", "worker", *pool, *quiet]]


if __name__ == "__main__":
    _driver.main(CeleryAdapter)
