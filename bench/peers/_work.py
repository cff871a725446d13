"""What a benchmark job's handler does after recording its start: the same work for every system.

Kinds: ``noop`` (nothing: the no-op rows, which measure the queue's own cost per job), ``redis`` (one
pipelined round trip, INCR of a counter and SET of the job's key, to the system's private Redis),
``io1ms`` (1 ms of I/O wait) and ``cpu100us`` (about 100 µs of pure-Python CPU). Async workers await
an async client and ``asyncio.sleep``; sync workers (RQ, Celery, Dramatiq) use the sync client and
``time.sleep``. Each process's Redis pool holds as many connections as the process runs handlers at
once, so no system waits on a pool smaller than its concurrency.

The driver passes the kind and the worker concurrency to the workers it starts in WORK_ENV and
CONCURRENCY_ENV (a worker started by hand runs no-op jobs at the system's no-op concurrency).
bench/peers/bullmq/work.js is the same for BullMQ.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable

import redis
import redis.asyncio

from ._probe import REDIS_URL_ENV

WORK_ENV = "BENCH_WORK"
CONCURRENCY_ENV = "BENCH_CONCURRENCY"
KINDS = ("noop", "redis", "io1ms", "cpu100us")
#: the counter every ``redis`` job increments: the harness checks it against the jobs started
COUNT_KEY = "bench:work:count"
IO_S = 0.001
CPU_S = 0.000_1


def kind() -> str:
    chosen = os.environ.get(WORK_ENV, "noop")
    if chosen not in KINDS:
        raise ValueError(f"{WORK_ENV}={chosen!r}: choose from {', '.join(KINDS)}")
    return chosen


def concurrency(pinned: dict[str, int]) -> int:
    """The concurrency the driver chose, else the system's pinned one for this kind of work."""
    chosen = os.environ.get(CONCURRENCY_ENV)
    return int(chosen) if chosen else pinned[kind()]


def _spin(rounds: int) -> int:
    total = 0
    for i in range(rounds):
        total = (total * 31 + i) % 65521
    return total


def _calibrate(seconds: float) -> int:
    """Rounds of ``_spin`` that take ``seconds`` on this machine. The fastest of several timings: a
    timing that shared the core with another process only ever comes out slower."""
    probe = 20_000
    best = min(_timed(probe) for _ in range(15))
    return max(1, round(probe * seconds / best))


def _timed(rounds: int) -> float:
    t0 = time.perf_counter()
    _spin(rounds)
    return time.perf_counter() - t0


def async_work(slots: int) -> Callable[[int], Awaitable[None]] | None:
    """The work for an async handler running up to ``slots`` jobs at once; None for no-op jobs (the
    handler then does exactly what it did before there was work to choose)."""
    chosen = kind()
    if chosen == "noop":
        return None
    if chosen == "io1ms":

        async def sleep(seq: int) -> None:
            await asyncio.sleep(IO_S)

        return sleep
    if chosen == "cpu100us":
        rounds = _calibrate(CPU_S)

        async def burn(seq: int) -> None:
            _spin(rounds)

        return burn
    return AsyncRoundTrip(slots)


def sync_work(slots: int) -> Callable[[int], None] | None:
    """The same for a sync handler (``slots``: the process's threads running handlers)."""
    chosen = kind()
    if chosen == "noop":
        return None
    if chosen == "io1ms":

        def sleep(seq: int) -> None:
            time.sleep(IO_S)

        return sleep
    if chosen == "cpu100us":
        rounds = _calibrate(CPU_S)

        def burn(seq: int) -> None:
            _spin(rounds)

        return burn
    return SyncRoundTrip(slots)


class AsyncRoundTrip:
    """INCR + SET in one pipeline; a caller beyond the pool's ``slots`` connections waits for one."""

    def __init__(self, slots: int) -> None:
        url = os.environ[REDIS_URL_ENV]
        self.pool = redis.asyncio.BlockingConnectionPool.from_url(url, max_connections=slots)
        self.client = redis.asyncio.Redis(connection_pool=self.pool)

    async def __call__(self, seq: int) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.incr(COUNT_KEY)
        pipe.set(f"bench:work:{seq}", seq)
        await pipe.execute()

    async def aclose(self) -> None:
        await self.client.aclose()
        await self.pool.disconnect()


class SyncRoundTrip:
    def __init__(self, slots: int) -> None:
        url = os.environ[REDIS_URL_ENV]
        self.pool = redis.BlockingConnectionPool.from_url(url, max_connections=slots)
        self.client = redis.Redis(connection_pool=self.pool)

    def __call__(self, seq: int) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.incr(COUNT_KEY)
        pipe.set(f"bench:work:{seq}", seq)
        pipe.execute()

    def close(self) -> None:
        self.client.close()
        self.pool.disconnect()
