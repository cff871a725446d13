"""The reconciler restores only jobs still active: not one that finished or was cancelled while the
reconciler was between reading its page and restoring it.

The reconciler runs against a real Redis and a real store; the store is wrapped to let the other
party (the shard's former owner, a cancel) act at exactly that moment.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest
import redis.asyncio as aredis

from dispatcher.queue.ids import new_job_id
from dispatcher.queue.reconciler import Reconciler
from dispatcher.queue.records import JobRecord
from dispatcher.queue.states import JobState, Priority
from dispatcher.queue.status_writer import StatusWriter, lease_update, transition_update
from dispatcher.queue.working_set import NewJob, WorkingSet
from dispatcher.store import JobRow, Store, open_store
from shardq_common.clock import wall_ms
from tests.support.wait import wait_for

SHARD = 3
JOB_TYPE = "noop.reconciled"
Hook = Callable[[], Awaitable[None]]


class Interleaved:
    """A store whose reads run a hook first thing after they return: ``after_page`` once the
    reconciler has read a page of active ids, ``after_reread`` once it has read its missing rows."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.after_page: list[Hook] = []
        self.after_reread: list[Hook] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def active_ids(self, shard: int) -> AsyncIterator[list[str]]:
        async for ids in self.store.active_ids(shard):
            while self.after_page:
                await self.after_page.pop(0)()
            yield ids

    async def get_jobs(self, ids: Sequence[str]) -> list[JobRow]:
        rows = await self.store.get_jobs(ids)
        while self.after_reread:
            await self.after_reread.pop(0)()
        return rows


class Shard:
    """One shard's Redis working set and DB rows, with a status writer, as a dispatcher has them."""

    def __init__(self, store: Store, redis: Any) -> None:
        self.store = Interleaved(store)
        self.working_set = WorkingSet(redis)
        self.writer = StatusWriter(store, self.working_set, flush_interval_ms=10)
        self.reconciler = Reconciler(self.store, self.working_set, self.writer)  # type: ignore[arg-type]

    async def commit_new_job(self) -> NewJob:
        now = wall_ms()
        job = NewJob(
            new_job_id(),
            JobRecord(
                JOB_TYPE, Priority.DEFAULT, JobState.READY, now, now, max_attempts=3, lease_ttl_ms=60_000
            ),
            b"{}",
        )
        row = JobRow(
            job.id, JOB_TYPE, SHARD, int(Priority.DEFAULT), job.payload, "ready", now, None, 0, 0, 0, 3,
            60_000, None, None, None, None, now, None, None, now,
        )  # fmt: skip
        await self.store.insert_jobs([row])
        return job

    async def acquire(self, epoch: int, owner: str) -> None:
        """Take the shard; the lease lapses at once, so the next owner may take it over."""
        now = wall_ms()
        assert await self.working_set.acquire(SHARD, epoch, owner, now, now) in (0, 1)


@pytest.fixture
async def shard(db_url: str, redis_url: str) -> AsyncIterator[Shard]:
    store = await open_store(db_url)
    await store.migrate()
    client = aredis.Redis.from_url(redis_url)
    shard = Shard(store, client)
    shard.writer.start()
    yield shard
    await shard.writer.stop()
    await client.aclose()
    await store.close()


async def test_a_job_the_former_owner_finished_after_the_page_was_read_is_not_restored(shard: Shard) -> None:
    """The former owner's worker acks the job after the new owner read the page that lists it as
    leased; the former owner commits the success and drops the finished record from Redis before the
    new owner looks for the page's jobs in Redis. Restoring it from the row read earlier would run
    it again."""
    await shard.acquire(1, "old")
    job = await shard.commit_new_job()
    await shard.working_set.enqueue(SHARD, 1, wall_ms(), [job])
    (grant,), _ = await shard.working_set.lease(SHARD, 1, wall_ms(), [JOB_TYPE], [int(Priority.DEFAULT)])
    await shard.store.apply_updates([lease_update(grant, wall_ms())])
    await shard.acquire(2, "new")

    async def old_owner_finishes_it() -> None:
        (done,) = await shard.working_set.ack(SHARD, wall_ms(), [(grant.id, grant.token)])
        assert done is not None
        await shard.store.apply_updates([transition_update(done, wall_ms())])
        assert await shard.working_set.forget(SHARD, [grant.id]) == 1

    shard.store.after_page.append(old_owner_finishes_it)
    assert await shard.reconciler.reconcile(SHARD, 2) == 0
    assert await shard.working_set.record(SHARD, job.id) is None
    assert (await shard.store.get_job(job.id)).status == "succeeded"


@pytest.mark.parametrize("moment", ["after the page read", "after the re-read", "with its push arriving"])
async def test_a_job_cancelled_during_a_reconcile_is_not_restored(shard: Shard, moment: str) -> None:
    """Redis lost the job; it is cancelled while the reconciler is restoring its shard. Its cancel
    finds no record in Redis, notes the id (cancelled-unqueued) and marks the row: whichever of the
    two the reconciler sees, it must not put the job back. "with its push arriving": its enqueue's
    push reaches Redis after the cancel (and is skipped) but before the reconciler's restore."""
    await shard.acquire(1, "only")
    job = await shard.commit_new_job()

    async def cancel_it() -> None:
        outcome = await shard.working_set.cancel(SHARD, job.id, JOB_TYPE, Priority.DEFAULT, wall_ms())
        assert outcome.code == 0  # not in Redis: noted for the pushes to come
        if moment == "with its push arriving":
            assert await shard.working_set.enqueue(SHARD, 1, wall_ms(), [job]) == [0]
        await shard.store.set_cancelled(job.id)

    hooks = shard.store.after_page if moment == "after the page read" else shard.store.after_reread
    hooks.append(cancel_it)
    assert await shard.reconciler.reconcile(SHARD, 1) == 0
    assert await shard.working_set.record(SHARD, job.id) is None
    assert (await shard.store.get_job(job.id)).status == "cancelled"


async def test_a_job_pushed_run_and_finished_while_its_page_is_restored_is_not_restored(shard: Shard) -> None:
    """Redis does not hold the job when the reconciler looks; its enqueue's push arrives right after
    the reconciler re-read its row, and a worker of this process runs it at once. Its success is
    committed, but its finished record stays in Redis until the page is restored: dropped earlier,
    the restore (with the row it read as ready) would put the job back and it would run again."""
    await shard.acquire(1, "only")
    job = await shard.commit_new_job()

    async def pushed_and_run() -> None:
        assert await shard.working_set.enqueue(SHARD, 1, wall_ms(), [job]) == [1]
        (grant,), _ = await shard.working_set.lease(SHARD, 1, wall_ms(), [JOB_TYPE], [int(Priority.DEFAULT)])
        (done,) = await shard.working_set.ack(SHARD, wall_ms(), [(grant.id, grant.token)])
        assert done is not None
        shard.writer.record(SHARD, transition_update(done, wall_ms()))
        await shard.writer.flush()
        # The record may go once the commit is on disk (a few hundred ms at most): give it the time.
        with contextlib.suppress(AssertionError):
            await wait_for(_gone(shard, job.id), timeout=1.0, interval=0.05)

    shard.store.after_reread.append(pushed_and_run)
    assert await shard.reconciler.reconcile(SHARD, 1) == 0
    record = await shard.working_set.record(SHARD, job.id)
    assert record is None or record.state is JobState.SUCCEEDED
    assert (await shard.store.get_job(job.id)).status == "succeeded"
    await wait_for(_gone(shard, job.id), timeout=10, message="the finished record was never dropped")


def _gone(shard: Shard, job_id: str) -> Callable[[], Awaitable[bool]]:
    async def gone() -> bool:
        return await shard.working_set.record(SHARD, job_id) is None

    return gone


async def test_an_active_job_redis_lost_is_restored_once(shard: Shard) -> None:
    """The other side: a job Redis lost and nobody touched is put back, delayed at its run_at, and a
    second reconcile finds it there."""
    await shard.acquire(1, "only")
    job = await shard.commit_new_job()
    assert await shard.reconciler.reconcile(SHARD, 1) == 1
    record = await shard.working_set.record(SHARD, job.id)
    assert record is not None and record.state is JobState.DELAYED
    assert await shard.reconciler.reconcile(SHARD, 1) == 0
