"""One enqueue's round trip taken apart: the floor of each hop it makes, then the call itself.

    python -m bench.enqueue_path [--processes 2] [--calls 2000]

Starts a private redis-server, a fresh PostgreSQL database and ``dispatcher run`` with N processes
(as the benchmark does), then prints p50/p99 in ms of: a Redis round trip, a durable one-row
``INSERT`` (autocommit), a bare unary gRPC call (``GetVersion``) with ``grpc.aio`` and with the
blocking stub, single enqueues awaited one after another with ``Client`` (``route=True``: straight
to the job's shard owner; ``route=False``: to any process, which hands another's jobs on with
``PushJobs`` before it answers) and ``AsyncClient`` (``route=True``), and 64 single ``AsyncClient``
enqueues in flight (jobs/s). Over 8 job types, so with 2 processes about half the unrouted calls
take the hand-off.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import psycopg
import redis.asyncio as aioredis

from shardq_common.pb import shardq_pb2 as pb
from shardq_common.pb import shardq_pb2_grpc as pb_grpc
from worker_sdk import AsyncClient, Client

from .infra.stack import shardq_stack

TYPES = [f"noop{i}" for i in range(8)]


def _summary(name: str, samples_s: list[float]) -> None:
    ms = sorted(x * 1000 for x in samples_s)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    rate = len(ms) / (sum(ms) / 1000)
    print(f"{name:<44} p50 {statistics.median(ms):6.3f} ms  p99 {p99:6.3f} ms  ({rate:,.0f}/s in turn)")


async def _timed(call: Callable[[], Awaitable[object]], count: int) -> list[float]:
    for _ in range(min(50, count)):  # warm up
        await call()
    out = []
    for _ in range(count):
        t0 = time.perf_counter()
        await call()
        out.append(time.perf_counter() - t0)
    return out


async def _floors(redis_url: str, db_url: str, target: str, count: int) -> None:
    r = aioredis.Redis.from_url(redis_url)
    _summary("redis PING (redis-py asyncio)", await _timed(r.ping, count))
    await r.aclose()
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS probe (id bigserial PRIMARY KEY, v bytea)")
        _summary("postgres SELECT 1", await _timed(lambda: conn.execute("SELECT 1"), count))
        insert = "INSERT INTO probe (v) VALUES (%s)"
        _summary(
            "postgres durable one-row INSERT", await _timed(lambda: conn.execute(insert, (b"x",)), count)
        )
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.JobServiceStub(channel)
        _summary(
            "grpc.aio unary GetVersion", await _timed(lambda: stub.GetVersion(pb.GetVersionRequest()), count)
        )


def _sync_timed(call: Callable[[], object], count: int) -> list[float]:
    for _ in range(min(50, count)):
        call()
    out = []
    for _ in range(count):
        t0 = time.perf_counter()
        call()
        out.append(time.perf_counter() - t0)
    return out


async def _async_client(target: str, count: int) -> None:
    async with AsyncClient(target, route=True) as client:
        seq = iter(range(10**9))
        samples = await _timed(lambda: client.enqueue(TYPES[next(seq) % len(TYPES)], {"s": 1}), count)
        _summary("AsyncClient(route=True).enqueue, one at a time", samples)
        slots = asyncio.Semaphore(64)

        async def one(i: int) -> None:
            try:
                await client.enqueue(TYPES[i % len(TYPES)], {"s": i})
            finally:
                slots.release()

        tasks = []
        t0 = time.perf_counter()
        for i in range(count * 5):
            await slots.acquire()
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - t0
        print(f"{'AsyncClient.enqueue, 64 in flight':<44} {count * 5 / elapsed:,.0f} jobs/s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as logs, shardq_stack(Path(logs), args.processes) as stack:
        target = stack.dispatcher.target
        asyncio.run(_floors(stack.redis_url, stack.db_url, target, args.calls))
        with grpc.insecure_channel(target) as channel:
            stub = pb_grpc.JobServiceStub(channel)
            _summary(
                "grpc blocking unary GetVersion",
                _sync_timed(lambda: stub.GetVersion(pb.GetVersionRequest()), args.calls),
            )
        for route in (True, False):
            with Client(target, route=route) as client:
                seq = iter(range(10**9))
                samples = _sync_timed(
                    lambda client=client, seq=seq: client.enqueue(TYPES[next(seq) % len(TYPES)], {"s": 1}),
                    args.calls,
                )
                _summary(f"Client(route={route}).enqueue, one at a time", samples)
        asyncio.run(_async_client(target, args.calls))


if __name__ == "__main__":
    main()
