"""saq's driver: ``Queue.enqueue`` per job (``scheduled`` for delayed ones); saq's only batch form,
``map``, also waits for results, so a batch is concurrent ``enqueue`` calls (what ``map`` does
inside). Workers: ``saq --workers 2``, CONCURRENCY jobs at a time each, scheduled jobs checked every
second (the default, and the least: saq uses the period as a lock's whole-second expiry)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from saq import Queue

from . import _driver, _work
from ._probe import REDIS_URL_ENV, job_started

# Jobs at a time per worker process, per kind of work. `python -m bench sweep --system saq --work WORK`
# (drain of 20,000, best of 2-3 rounds in turns): redis 4 -> 3.1K jobs/s, 8 -> 3.2K, 16 -> 3.2-3.4K,
# 32 -> 3.0-3.2K, 64 -> 3.2K, 128 -> 2.7K; io1ms 16 -> 3.8K, 32 -> 3.9K, 64 -> 3.8K, 128 -> 3.1K;
# cpu100us 8 -> 2.7K, 16 -> 2.9K, 32 -> 2.8K.
CONCURRENCY = {"noop": 32, "redis": 16, "io1ms": 32, "cpu100us": 16}
SCHEDULE_TIMER_S = 1


def make_queue() -> Queue:
    return Queue.from_url(os.environ.get(REDIS_URL_ENV, "redis://127.0.0.1:6379/0"), name="bench")


WORK = _work.async_work(_work.concurrency(CONCURRENCY))


async def job(ctx: dict[str, Any], *, seq: int, t: float, r: float) -> None:
    job_started(seq, t, r)
    if WORK is not None:
        await WORK(seq)


settings = {
    "queue": make_queue(),
    "functions": [job],
    "concurrency": _work.concurrency(CONCURRENCY),
    "timers": {"schedule": SCHEDULE_TIMER_S},
}


class SaqAdapter(_driver.Adapter):
    packages = ("saq", "redis")
    settings = {
        "schedule_timer_s": SCHEDULE_TIMER_S,
        "bulk": "asyncio.gather of enqueue (map without waiting)",
    }
    concurrency = CONCURRENCY
    concurrency_means = "concurrency of each worker process"

    async def open(self) -> None:
        self.queue = make_queue()
        await self.queue.connect()

    async def close(self) -> None:
        await self.queue.disconnect()

    async def enqueue(self, job: _driver.Job) -> None:
        # saq documents whole epoch seconds but stores the score as given: a float keeps the due time.
        due = {"scheduled": job.run_at} if job.run_at else {}
        await self.queue.enqueue("job", seq=job.seq, t=job.t_enqueued, r=job.run_at, **due)

    async def enqueue_batch(self, jobs: list[_driver.Job]) -> None:
        await asyncio.gather(*(self.enqueue(job) for job in jobs))

    def worker_commands(self, processes: int) -> list[list[str]]:
        cli = str(Path(sys.executable).with_name("saq"))
        return [[cli, "bench.peers.saq.settings", "--workers", str(processes)]]


if __name__ == "__main__":
    _driver.main(SaqAdapter)
