"""Worker SDK against a real dispatcher process: results, Retry, SkipRetry, timeouts, sync handlers."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from structlog.testing import capture_logs

from tests.support.processes import ROOT, _env
from tests.support.wait import wait_for, wait_until
from worker_sdk import (
    AsyncClient,
    Client,
    DispatcherInfo,
    InvalidArgumentError,
    JobContext,
    JobInfo,
    QueueStats,
    RebalancePlan,
    Retry,
    ScheduleInfo,
    ShardInfo,
    ShardMap,
    ShardMove,
    SkipRetry,
    VersionInfo,
    serve,
)
from worker_sdk._pipelining import EnqueuePipeline

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


async def test_handler_outcomes(dispatcher):
    seen: dict[str, list[float]] = {}
    threads: set[str] = set()

    def sync_result(ctx: JobContext) -> dict:
        threads.add(threading.current_thread().name)
        return {"doubled": ctx.json()["n"] * 2}

    async def retry_later(ctx: JobContext) -> None:
        seen.setdefault(ctx.job_id, []).append(time.time())
        if ctx.attempt == 1:
            raise Retry(delay=0.3)

    async def give_up(ctx: JobContext) -> None:
        raise SkipRetry("malformed input")

    async def hang(ctx: JobContext) -> None:
        seen.setdefault(ctx.job_id, []).append(time.time())
        await asyncio.sleep(3600)

    handlers = {"sync": sync_result, "retry": retry_later, "final": give_up, "hang": hang}
    client = AsyncClient(dispatcher.target)
    async with serve(
        handlers, target=dispatcher.target, job_timeout=0.5, handle_signals=False, concurrency=4
    ):
        doubled = await client.enqueue("sync", {"n": 21})
        retried = await client.enqueue("retry", None)
        final = await client.enqueue("final", None)
        hung = await client.enqueue("hang", None, max_attempts=2)
        await wait_for(lambda: _status(client, doubled, "succeeded"))
        assert (await client.get_job(doubled)).result == b'{"doubled": 42}'
        assert all(name.startswith("shardq-handler") for name in threads)

        await wait_for(lambda: _status(client, retried, "succeeded"), timeout=10)
        gap = seen[retried][1] - seen[retried][0]
        assert 0.3 <= gap < 0.9, f"Retry(delay=0.3) gave a {gap:.2f} s gap (backoff would be 1 s)"

        await wait_for(lambda: _status(client, final, "dead"))
        job = await client.get_job(final)
        assert (
            job.dead_reason == "not_retryable" and job.attempts == 1 and "malformed input" in job.last_error
        )

        await wait_for(lambda: _status(client, hung, "dead"), timeout=15)
        job = await client.get_job(hung)
        assert job.failures == 2 and "timed out after 0.5 s" in job.last_error
    await client.close()


async def test_jobs_go_only_to_workers_that_declared_their_type(dispatcher):
    client = AsyncClient(dispatcher.target)
    # The worker declares "other" only; a job of a type nobody declared is never handed to it.
    async with serve({"other": lambda ctx: None}, target=dispatcher.target, handle_signals=False) as worker:
        await worker.wait_connected()
        orphan = await client.enqueue("nobody", None)
        done = await client.enqueue("other", None)
        await wait_for(lambda: _status(client, done, "succeeded"))
        assert (await client.get_job(orphan)).status == "ready"
    await client.close()


async def _status(client: AsyncClient, job_id: str, status: str) -> bool:
    return (await client.get_job(job_id)).status == status


async def test_concurrent_enqueues_share_round_trips_and_keep_their_own_errors(dispatcher):
    """Calls made in the same turn of the event loop travel in one EnqueueMany, and calls made while
    it is in flight go together in the next; a job the dispatcher refuses fails only its own call
    (the batch is sent again one job per call)."""
    client = AsyncClient(dispatcher.target)
    round_trips: Counter[str] = Counter()

    def counted(name: str, call: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def wrapper(*args: Any) -> Any:
            round_trips[name] += 1
            return await call(*args)

        return wrapper

    client._pipeline = EnqueuePipeline(
        counted("Enqueue", client._enqueue_one), counted("EnqueueMany", client._enqueue_specs)
    )
    try:
        ids = await asyncio.gather(*(client.enqueue("noop.pipe", {"i": i}) for i in range(50)))
        assert len(set(ids)) == 50 and round_trips == {"EnqueueMany": 1}
        assert [(await client.get_job(i)).type for i in ids] == ["noop.pipe"] * 50

        round_trips.clear()
        calls = [asyncio.ensure_future(client.enqueue("noop.pipe")) for _ in range(20)]
        for _ in range(3):  # the first batch is on its way: later calls, turn after turn, wait for it
            await asyncio.sleep(0)
            calls += [asyncio.ensure_future(client.enqueue("noop.pipe")) for _ in range(10)]
        assert len(set(await asyncio.gather(*calls))) == 50
        assert round_trips == {"EnqueueMany": 2}

        round_trips.clear()
        outcomes = await asyncio.gather(
            client.enqueue("noop.pipe", {"i": "a"}),
            client.enqueue("", {"i": "bad"}),  # refused by the dispatcher: an empty type
            client.enqueue("noop.pipe", {"i": "b"}),
            return_exceptions=True,
        )
        assert isinstance(outcomes[1], InvalidArgumentError) and "type" in str(outcomes[1])
        good = [o for i, o in enumerate(outcomes) if i != 1]
        assert all(isinstance(o, str) for o in good)
        assert [json.loads((await client.get_job(i)).payload) for i in good] == [{"i": "a"}, {"i": "b"}]
        assert round_trips == {"EnqueueMany": 1, "Enqueue": 3}

        round_trips.clear()
        await client.enqueue("noop.pipe")  # alone: a plain Enqueue
        assert round_trips == {"Enqueue": 1}
    finally:
        await client.close()


async def test_handlers_stuck_past_their_timeout_hold_no_job_hostage(dispatcher):
    """Two sync handlers that never look at ctx.cancelled block both threads of a concurrency-2 worker
    past their timeout. The worker must say so and take no lease it cannot run: the jobs enqueued
    meanwhile stay ready with no attempt charged, and run once each when the threads come back."""
    job_timeout = 1.0
    release = threading.Event()
    stuck_contexts: list[JobContext] = []
    ordinary_runs: Counter[str] = Counter()

    def block(ctx: JobContext) -> None:
        stuck_contexts.append(ctx)
        release.wait()  # an uninterruptible call: it neither polls nor waits on ctx.cancelled

    def ordinary(ctx: JobContext) -> None:
        ordinary_runs[ctx.job_id] += 1

    client = AsyncClient(dispatcher.target)
    try:
        with capture_logs() as logs:
            worker = serve(
                {"block": block, "ordinary": ordinary},
                target=dispatcher.target,
                concurrency=2,
                job_timeout=job_timeout,
                handle_signals=False,
            )
            async with worker:
                blocked = [await client.enqueue("block", None, max_attempts=1) for _ in range(2)]
                await wait_for(lambda: len(stuck_contexts) == 2)
                ids = [await client.enqueue("ordinary", {"i": i}) for i in range(10)]
                for job_id in blocked:
                    await wait_for(lambda job_id=job_id: _status(client, job_id, "dead"), timeout=15)
                    assert "timed out after 1.0 s" in (await client.get_job(job_id)).last_error

                # Long enough for a job queued behind the stuck threads to time out in the queue.
                window = time.monotonic() + 3 * job_timeout
                while time.monotonic() < window:
                    charged = [
                        j for j in await asyncio.gather(*(client.get_job(i) for i in ids)) if j.attempts
                    ]
                    assert not charged, (
                        "a job was leased while every handler thread was stuck: "
                        f"{[(j.status, j.attempts, j.failures, j.last_error[-40:]) for j in charged]}"
                    )
                    await asyncio.sleep(0.1)
                assert worker.stuck_threads == 2 and not ordinary_runs
                assert all(ctx.cancelled for ctx in stuck_contexts), "the timeout must set ctx.cancelled"
                assert any(e["event"] == "every handler thread is stuck" for e in logs), logs

                release.set()
                for job_id in ids:
                    await wait_for(lambda job_id=job_id: _status(client, job_id, "succeeded"), timeout=15)
                jobs = [await client.get_job(i) for i in ids]
                assert [(j.attempts, j.failures) for j in jobs] == [(1, 0)] * 10
                assert ordinary_runs == Counter({i: 1 for i in ids})
                await wait_for(lambda: worker.stuck_threads == 0)
    finally:
        release.set()
        await client.close()


async def test_a_sync_handler_that_waits_on_cancelled_returns_at_its_timeout(dispatcher):
    """The timeout sets ctx.cancelled and wakes ctx.wait_cancelled(): a handler that waits on it gives
    its thread back at once, and the next job runs in it."""
    job_timeout = 0.5
    observed: dict[str, float] = {}

    def cooperative(ctx: JobContext) -> None:
        began = time.monotonic()
        assert not ctx.cancelled
        if ctx.wait_cancelled(timeout=30):
            observed["cancelled_after"] = time.monotonic() - began
            observed["flag"] = ctx.cancelled

    def own_timeout(ctx: JobContext) -> None:
        raise TimeoutError("socket read timed out")

    client = AsyncClient(dispatcher.target)
    try:
        async with serve(
            {"coop": cooperative, "ordinary": lambda ctx: None, "own_timeout": own_timeout},
            target=dispatcher.target,
            concurrency=1,
            job_timeout=job_timeout,
            handle_signals=False,
        ) as worker:
            coop = await client.enqueue("coop", None, max_attempts=1)
            after = await client.enqueue("ordinary", None)
            await wait_for(lambda: _status(client, coop, "dead"), timeout=15)
            assert "timed out after 0.5 s" in (await client.get_job(coop)).last_error
            await wait_for(lambda: _status(client, after, "succeeded"), timeout=15)
            assert (await client.get_job(after)).attempts == 1
            assert observed["flag"] is True
            # From the handler's own clock: its thread may start it a moment after the budget began.
            assert job_timeout - 0.1 <= observed["cancelled_after"] < job_timeout + 2.0

            # A TimeoutError of the handler's own is its failure, not the worker's timeout.
            failed = await client.enqueue("own_timeout", None, max_attempts=1)
            await wait_for(lambda: _status(client, failed, "dead"), timeout=15)
            assert "socket read timed out" in (await client.get_job(failed)).last_error
            await wait_for(lambda: worker.stuck_threads == 0)
    finally:
        await client.close()


PLAIN_SCRIPT = """
import sys
from pathlib import Path

from worker_sdk import serve


def record(ctx):
    Path(sys.argv[2]).write_text(ctx.id)


serve({"script.record": record}, target=sys.argv[1], shutdown_grace=5)
"""


def test_serve_in_a_plain_script_serves_until_sigterm(dispatcher, tmp_path):
    """``serve(handlers)`` in synchronous code, with no event loop running, serves until SIGTERM and
    then exits 0; it must not return at once having served nothing."""
    script, ran, log_path = tmp_path / "plain_worker.py", tmp_path / "ran", tmp_path / "plain_worker.log"
    script.write_text(PLAIN_SCRIPT)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, str(script), dispatcher.target, str(ran)],
            env=_env({}),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        with Client(dispatcher.target) as client:
            job_id = client.enqueue("script.record", None)
            wait_until(lambda: ran.exists() or process.poll() is not None, timeout=30)
            assert process.poll() is None, (
                f"the script exited ({process.returncode}) without serving: {log_path.read_text()}"
            )
            wait_until(lambda: client.get_job(job_id).status == "succeeded", timeout=15)
        assert ran.read_text() == job_id
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0, log_path.read_text()
        assert "worker stopped" in log_path.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


async def test_both_clients_give_the_same_typed_results(dispatcher):
    async with AsyncClient(dispatcher.target) as aio:
        with Client(dispatcher.target) as blocking:
            shard_map = await aio.shard_map()
            assert isinstance(shard_map, ShardMap) and shard_map == blocking.shard_map()
            assert shard_map.shard_count == 8 and len(shard_map.shards) == 8
            assert all(isinstance(s, ShardInfo) for s in shard_map.shards)
            assert [(type(m), m.alive) for m in shard_map.members] == [(DispatcherInfo, True)]

            plan = await aio.rebalance(dry_run=True)
            assert isinstance(plan, RebalancePlan) and plan == blocking.rebalance(dry_run=True)
            assert plan.applied is False and all(isinstance(m, ShardMove) for m in plan.moves)

            version = await aio.version()
            assert isinstance(version, VersionInfo) and version == blocking.version()
            assert version.shard_count == 8 and version.protocol >= 1 and version.version

            job_id = await aio.enqueue("typed.result", {"n": 1}, delay=3600)
            job = await aio.get_job(job_id)
            assert isinstance(job, JobInfo) and job.id == job_id and job.status == "delayed"
            stats = await aio.stats()
            assert stats == blocking.stats() and all(isinstance(q, QueueStats) for q in stats)

            info, changed = await aio.upsert_schedule(name="typed", cron="0 3 * * *", job_type="typed.result")
            assert isinstance(info, ScheduleInfo) and changed
            paused = await aio.pause_schedule("typed")
            assert isinstance(paused, ScheduleInfo) and paused.enabled is False
            assert (await aio.resume_schedule("typed")).enabled is True
            occurrences, zone = await aio.next_occurrences("typed", 3)
            assert (occurrences, zone) == blocking.next_occurrences("typed", 3)
            assert len(occurrences) == 3 and zone == "UTC"


async def test_max_in_flight_keeps_a_handler_within_its_connection_pool(dispatcher, redis_url):
    """A worker of concurrency 200 whose handler uses redis-py's asyncio client with a pool of 10
    connections: capped at 10 in flight, no job fails on "Too many connections" and every job runs
    at its first attempt (uncapped, most of them fail on it: the issue users hit)."""
    import redis.asyncio as aioredis

    pool_size, jobs = 10, 300
    cache = aioredis.Redis.from_url(redis_url, max_connections=pool_size)
    most_at_once = in_flight = 0

    async def pooled(ctx: JobContext) -> None:
        nonlocal most_at_once, in_flight
        in_flight += 1
        most_at_once = max(most_at_once, in_flight)
        try:
            await cache.blpop([f"nothing:{ctx.job_id}"], timeout=0.01)  # holds its connection ~10 ms
        finally:
            in_flight -= 1

    client = AsyncClient(dispatcher.target)
    try:
        worker = serve(
            {"pooled": pooled},
            target=dispatcher.target,
            concurrency=200,
            max_in_flight={"pooled": pool_size},
            handle_signals=False,
        )
        async with worker:
            ids = await client.enqueue_many([{"type": "pooled", "max_attempts": 1} for _ in range(jobs)])
            await wait_for(lambda: _all_finished(client, ids), timeout=60)
            failed = [
                j for j in await asyncio.gather(*(client.get_job(i) for i in ids)) if j.status != "succeeded"
            ]
            assert not failed, [(j.status, j.last_error.strip().splitlines()[-1:]) for j in failed[:3]]
            assert most_at_once == pool_size
            # Every type capped: the worker leases no more than it can run.
            assert worker.concurrency == pool_size
    finally:
        await client.close()
        await cache.aclose()


async def _all_finished(client: AsyncClient, ids: list[str]) -> bool:
    jobs = await asyncio.gather(*(client.get_job(i) for i in ids))
    return all(j.status in ("succeeded", "dead") for j in jobs)
