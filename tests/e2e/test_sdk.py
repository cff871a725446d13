"""Worker SDK against a real dispatcher process: results, Retry, SkipRetry, timeouts, sync handlers."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tests.support.wait import wait_for
from worker_sdk import AsyncClient, JobContext, Retry, SkipRetry, serve

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
