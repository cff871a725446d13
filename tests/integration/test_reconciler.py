"""The reconciler restores only jobs still active: not one that finished or was cancelled while the
reconciler was between reading its page and restoring it. A young job missing from Redis may have its
push on the way: it is restored only if the push does not come, and reported as lost from Redis only
if nobody noted that its push had failed.

The reconciler runs against a real Redis and a real store; the store is wrapped to let the other
party (the shard's former owner, a cancel) act at exactly that moment.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest
import redis.asyncio as aredis
from structlog.testing import capture_logs

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


# The time a young job's push is given here: long enough for a test's push to land on a busy machine.
IN_FLIGHT_MS = 3_000
# The store's page of active ids (Store.active_ids).
PAGE = 2000


class Shard:
    """One shard's Redis working set and DB rows, with a status writer, as a dispatcher has them."""

    def __init__(self, store: Store, redis: Any) -> None:
        self.store = Interleaved(store)
        self.working_set = WorkingSet(redis)
        self.writer = StatusWriter(store, self.working_set, flush_interval_ms=10)
        self.reconciler = Reconciler(
            self.store,  # type: ignore[arg-type]
            self.working_set,
            self.writer,
            in_flight_ms=IN_FLIGHT_MS,
        )

    async def commit_new_job(self, enqueued_ago_ms: int = 60_000) -> NewJob:
        """A ready job's row, enqueued ``enqueued_ago_ms`` ago: by default long enough for its push to
        have come (a job missing from Redis then is one Redis lost)."""
        enqueued = wall_ms() - enqueued_ago_ms
        job = NewJob(
            new_job_id(),
            JobRecord(
                JOB_TYPE,
                Priority.DEFAULT,
                JobState.READY,
                enqueued,
                enqueued,
                max_attempts=3,
                lease_ttl_ms=60_000,
            ),
            b"{}",
        )
        row = JobRow(
            job.id, JOB_TYPE, SHARD, int(Priority.DEFAULT), job.payload, "ready", enqueued, None, 0, 0, 0,
            3, 60_000, None, None, None, None, enqueued, None, None, enqueued,
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
    leased = await shard.working_set.lease(SHARD, 1, wall_ms(), [JOB_TYPE], [int(Priority.DEFAULT)])
    (grant,) = leased.grants
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
        leased = await shard.working_set.lease(SHARD, 1, wall_ms(), [JOB_TYPE], [int(Priority.DEFAULT)])
        (grant,) = leased.grants
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


def restores_logged(logs: list[dict[str, Any]]) -> dict[str, int]:
    """The jobs the reconciler said it restored, by log level: warning (lost from Redis) or info (its
    push had failed)."""
    out: dict[str, int] = {}
    for e in logs:
        if e["event"] in (
            "restored jobs missing from Redis",
            "restored committed jobs whose push had failed",
        ):
            out[e["log_level"]] = out.get(e["log_level"], 0) + e["restored"]
    return out


def at_the_second_look(shard: Shard, then: Callable[[], Awaitable[None]]) -> None:
    """Run ``then`` as the reconcile looks in Redis for the second time, before the look: the
    first finds the job missing, the second comes once the reconcile has waited for it."""
    looks = 0
    look = shard.working_set.missing

    async def looking(shard_: int, ids: Sequence[str]) -> dict[str, bool]:
        nonlocal looks
        looks += 1
        if looks == 2:
            await then()
        return await look(shard_, ids)

    shard.working_set.missing = looking  # type: ignore[method-assign]


async def reconcile_while_a_push_lands(
    shard: Shard, job: NewJob
) -> tuple[int, list[list[int]], dict[str, int]]:
    """Reconcile while the job's push is on its way; it lands at the second look, or after the
    reconcile should that not look again. Returns what the reconcile restored, what the push
    answered and the restores logged."""
    pushed: list[list[int]] = []

    async def push() -> None:
        pushed.append(await shard.working_set.enqueue(SHARD, 1, wall_ms(), [job]))

    at_the_second_look(shard, push)
    with capture_logs() as logs:
        restored = await shard.reconciler.reconcile(SHARD, 1)
    if not pushed:  # the reconcile did not wait: the push comes after it
        await push()
    return restored, pushed, restores_logged(logs)


async def test_a_young_job_whose_push_lands_during_the_reconcile_is_queued_once_by_its_push(
    shard: Shard,
) -> None:
    """Committed a moment ago, its push still on the way (behind its enqueue's answer, or a hand-off):
    the reconcile finds it missing and waits for the push rather than restoring it. The push lands
    before the reconcile looks again; it queues the job, once, and nothing is reported."""
    await shard.acquire(1, "only")
    job = await shard.commit_new_job(enqueued_ago_ms=0)
    # Queued ready by its push, not found there already.
    assert await reconcile_while_a_push_lands(shard, job) == (0, [[1]], {})
    record = await shard.working_set.record(SHARD, job.id)
    assert record is not None and record.state is JobState.READY


async def test_after_a_loss_a_job_accepted_since_is_awaited_like_any_young_job(shard: Shard) -> None:
    """A dispatcher starting on an empty Redis takes each shard as lost, and answers enqueues while
    it reconciles them: a job accepted after the loss was seen was pushed to the Redis that came
    after. Found missing, its push is on its way: awaited, and no loss is reported (before, it was
    restored at once and reported as missing from Redis)."""
    await shard.acquire(1, "only")
    shard.reconciler.note_loss(SHARD, wall_ms() - 5)
    job = await shard.commit_new_job(enqueued_ago_ms=0)
    assert await reconcile_while_a_push_lands(shard, job) == (0, [[1]], {})


async def test_after_a_loss_a_young_job_accepted_before_it_is_restored_at_once_as_lost(shard: Shard) -> None:
    """Accepted a moment before the loss was seen: its push went to the Redis that lost it, so it is
    not awaited."""
    await shard.acquire(1, "only")
    job = await shard.commit_new_job(enqueued_ago_ms=5)
    shard.reconciler.note_loss(SHARD)
    with capture_logs() as logs:
        assert await shard.reconciler.reconcile(SHARD, 1) == 1
    assert wall_ms() - job.record.enqueued_at_ms < IN_FLIGHT_MS, "it waited for a push Redis had lost"
    assert restores_logged(logs) == {"warning": 1}


async def test_a_job_awaited_since_one_loss_is_restored_at_once_when_a_second_loss_is_seen(
    shard: Shard,
) -> None:
    """The reconcile awaits a job accepted after a first loss; Redis then loses the shard again, with
    the job's push in it, and the loss is seen while the reconcile waits. The later loss decides: the
    job is restored at once and reported lost, not held back for its push's whole time."""
    await shard.acquire(1, "only")
    shard.reconciler.note_loss(SHARD, wall_ms() - 5)
    job = await shard.commit_new_job(enqueued_ago_ms=0)

    async def lost_again() -> None:
        shard.reconciler.note_loss(SHARD)

    at_the_second_look(shard, lost_again)
    with capture_logs() as logs:
        assert await shard.reconciler.reconcile(SHARD, 1) == 1
    assert wall_ms() - job.record.enqueued_at_ms < IN_FLIGHT_MS, "it waited out the push of a lost job"
    assert restores_logged(logs) == {"warning": 1}


async def test_a_young_job_whose_push_never_comes_is_restored_as_lost_once_it_is_late(shard: Shard) -> None:
    """Nothing pushes it nor notes it: Redis lost it (a flush right after the enqueue). It is put back
    once its push is late, and reported as missing from Redis."""
    await shard.acquire(1, "only")
    job = await shard.commit_new_job(enqueued_ago_ms=0)
    with capture_logs() as logs:
        assert await shard.reconciler.reconcile(SHARD, 1) == 1
    assert wall_ms() - job.record.enqueued_at_ms >= IN_FLIGHT_MS
    record = await shard.working_set.record(SHARD, job.id)
    assert record is not None and record.state is JobState.DELAYED
    assert restores_logged(logs) == {"warning": 1}


@pytest.mark.parametrize("noted", ["before the reconcile", "while it waits"])
async def test_a_job_noted_as_unpushed_is_restored_at_once_and_not_reported_lost(
    shard: Shard, noted: str
) -> None:
    """Its push failed (no process owned the shard for a moment, Redis refused it) and the process that
    held it noted so: the reconcile restores it without waiting out its push, and as no loss."""
    await shard.acquire(1, "only")
    job = await shard.commit_new_job(enqueued_ago_ms=0)

    async def note_it() -> None:
        await shard.working_set.note_unpushed(SHARD, [job.id], wall_ms())

    if noted == "before the reconcile":
        await note_it()
    else:
        shard.store.after_reread.append(note_it)
    with capture_logs() as logs:
        assert await shard.reconciler.reconcile(SHARD, 1) == 1
    assert wall_ms() - job.record.enqueued_at_ms < IN_FLIGHT_MS, "it waited for a push that had failed"
    record = await shard.working_set.record(SHARD, job.id)
    assert record is not None and record.state is JobState.DELAYED
    assert restores_logged(logs) == {"info": 1}
    assert await shard.working_set.missing(SHARD, [job.id]) == {}
    assert await shard.working_set.enqueue(SHARD, 1, wall_ms(), [job]) == [0], "a late push queued it again"


async def test_a_reconcile_cut_short_by_a_takeover_says_what_it_restored(shard: Shard) -> None:
    """The shard is taken over between two pages: the next restore is fenced off and the reconcile
    ends with NotOwner. The jobs of the first page are back in Redis, and the log says so (it used to
    say nothing: a reconcile that ended by the fence never logged its count)."""
    from shardq_common.errors import NotOwner

    await shard.acquire(1, "old")
    for _ in range(PAGE + 1):  # two pages of active ids
        await shard.commit_new_job()
    read_pages = shard.store.store.active_ids

    async def taken_over_after_the_first_page(shard_: int) -> AsyncIterator[list[str]]:
        pages = 0
        async for ids in read_pages(shard_):
            if pages == 1:
                await shard.acquire(2, "new")
            pages += 1
            yield ids

    shard.store.active_ids = taken_over_after_the_first_page  # type: ignore[method-assign]
    shard.reconciler.note_loss(SHARD)
    with capture_logs() as logs, pytest.raises(NotOwner):
        await shard.reconciler.reconcile(SHARD, 1)
    assert restores_logged(logs) == {"warning": PAGE}


async def test_a_reconcile_fenced_off_in_the_middle_of_a_page_says_what_it_restored(shard: Shard) -> None:
    """The same within one page: the shard is taken over between two chunks of it (RESTORE_CHUNK
    jobs a restore call). The first chunk's jobs are counted (they were lost with the page's count)."""
    from dispatcher.queue.reconciler import RESTORE_CHUNK
    from shardq_common.errors import NotOwner

    await shard.acquire(1, "old")
    for _ in range(RESTORE_CHUNK + 1):  # two chunks of one page
        await shard.commit_new_job()
    look = shard.working_set.missing
    looks = 0

    async def taken_over_before_the_second_chunk(shard_: int, ids: Sequence[str]) -> dict[str, bool]:
        nonlocal looks
        looks += 1
        if looks == 2:
            await shard.acquire(2, "new")
        return await look(shard_, ids)

    shard.working_set.missing = taken_over_before_the_second_chunk  # type: ignore[method-assign]
    shard.reconciler.note_loss(SHARD)
    with capture_logs() as logs, pytest.raises(NotOwner):
        await shard.reconciler.reconcile(SHARD, 1)
    assert restores_logged(logs) == {"warning": RESTORE_CHUNK}
