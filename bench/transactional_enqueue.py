"""The transactional enqueue measured: how soon a job enqueued in a producer's own PostgreSQL
transaction starts once the transaction commits, and how fast the batch form inserts.

    python -m bench.transactional_enqueue [--processes 2] [--samples 1000] [--batches 5]

Starts a private redis-server, a fresh PostgreSQL database and ``dispatcher run`` with N processes,
and an idle worker (concurrency 1,024, a no-op handler that notes when it starts) in this process.
Then prints:

- commit-to-start p50/p99/max: one job at a time, each in its own transaction (``BEGIN``,
  ``enqueue_in_transaction``, ``COMMIT``), from the moment the producer sends ``COMMIT`` to the
  moment the handler starts; the next job waits until it has (an idle worker). The path measured:
  the commit, PostgreSQL's notification to the shard's owner, its read of the new rows, the push to
  Redis, the lease and the message to the worker.
- the batch form: ``enqueue_many_in_transaction`` of 10,000 jobs and the commit, per batch, as
  jobs/s inserted, and the time from the commit until the worker has started all of them.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import psycopg

from worker_sdk import JobContext, enqueue_in_transaction_async, enqueue_many_in_transaction_async, serve

from .infra.stack import shardq_stack

TYPES = [f"txn.noop{i}" for i in range(8)]
BATCH = 10_000


class Starts:
    """When each job's handler started (perf_counter), and who waits for which."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.count = 0
        self._waiting: dict[str, asyncio.Future[float]] = {}
        self._all: tuple[int, asyncio.Future[float]] | None = None

    async def handle(self, ctx: JobContext) -> None:
        now = time.perf_counter()
        self.count += 1
        future = self._waiting.pop(ctx.id, None)
        if future is not None and not future.done():
            future.set_result(now)
        else:
            self.at[ctx.id] = now
        if self._all is not None and self.count >= self._all[0] and not self._all[1].done():
            self._all[1].set_result(now)

    def started(self, job_id: str) -> asyncio.Future[float]:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        if job_id in self.at:
            future.set_result(self.at.pop(job_id))
        else:
            self._waiting[job_id] = future
        return future

    def all_started(self, count: int) -> asyncio.Future[float]:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._all = (count, future)
        return future


def _ms(samples: list[float]) -> str:
    ms = sorted(x * 1000 for x in samples)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"p50 {statistics.median(ms):6.2f} ms  p99 {p99:6.2f} ms  max {ms[-1]:6.2f} ms"


async def _measure(target: str, db_url: str, samples: int, batches: int) -> None:
    starts = Starts()
    handlers = {job_type: starts.handle for job_type in TYPES}
    async with serve(handlers, target=target, concurrency=1024, shutdown_grace=5):
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            latencies: list[float] = []
            for i in range(samples + 50):  # the first 50 warm up
                job_id = await enqueue_in_transaction_async(conn, TYPES[i % len(TYPES)], {"i": i})
                started = starts.started(job_id)
                t0 = time.perf_counter()
                await conn.commit()
                at = await asyncio.wait_for(started, timeout=30)
                if i >= 50:
                    latencies.append(at - t0)
            print(f"{'commit-to-start, idle worker (' + str(samples) + ' jobs)':<46} {_ms(latencies)}")

            for b in range(batches):
                jobs = [{"type": TYPES[j % len(TYPES)], "payload": {"b": b, "j": j}} for j in range(BATCH)]
                starts.count = 0
                all_started = starts.all_started(BATCH)
                t0 = time.perf_counter()
                await enqueue_many_in_transaction_async(conn, jobs)
                t1 = time.perf_counter()
                await conn.commit()
                t2 = time.perf_counter()
                done = await asyncio.wait_for(all_started, timeout=120)
                inserted = f"insert {BATCH / (t1 - t0):8,.0f} jobs/s ({(t1 - t0) * 1000:.0f} ms"
                ran = f"all started {(done - t2) * 1000:.0f} ms after the commit"
                print(
                    f"batch {b + 1}: {BATCH:,} jobs in one transaction: {inserted}, commit "
                    f"{(t2 - t1) * 1000:.0f} ms); {ran} ({BATCH / (done - t0):,.0f} jobs/s end to end)"
                )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as logs, shardq_stack(Path(logs), args.processes) as stack:
        asyncio.run(_measure(stack.dispatcher.target, stack.db_url, args.samples, args.batches))


if __name__ == "__main__":
    main()
