"""Retention against a real store (SQLite and PostgreSQL) and a real Redis: a pass deletes exactly
the finished rows past their type's period, per status, never an active row and never a finished
row whose record Redis still holds (its status write's forget has not happened); per-type periods
override the cluster's; the operator's prune counts and deletes in batches."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aredis

from dispatcher.config import RetentionPolicy
from dispatcher.queue import pruner as pruner_module
from dispatcher.queue.flow import QueueSettings
from dispatcher.queue.keys import ShardKeys
from dispatcher.queue.pruner import Pruner, Retention, prune_older_than
from dispatcher.queue.records import JobRecord
from dispatcher.queue.states import JobState, Priority
from dispatcher.queue.working_set import WorkingSet
from dispatcher.store import JobRow, Store
from shardmap import shard_for
from shardq_common.clock import wall_ms

SHARDS = 16
DAY_MS = 86_400_000
_ids = itertools.count()


def _row(job_type: str, status: str, finished_days_ago: float | None, *, key: str | None = None) -> JobRow:
    now = wall_ms()
    finished = None if finished_days_ago is None else int(now - finished_days_ago * DAY_MS)
    return JobRow(
        id=f"{job_type}-{status}-{next(_ids):06d}", type=job_type, shard=shard_for(job_type, SHARDS),
        priority=1, payload=b"{}", status=status, run_at=1, lease_until=None, attempts=1, failures=0,
        expirations=0, max_attempts=5, lease_ttl_ms=60_000, idem_key=key, last_error=None,
        dead_reason="failed" if status == "dead" else None, result=b"r" if status == "succeeded" else None,
        enqueued_at=1, started_at=None, finished_at=finished, updated_at=1,
    )  # fmt: skip


@pytest.fixture
async def working_set(redis_url: str) -> AsyncIterator[WorkingSet]:
    client = aredis.from_url(redis_url)
    try:
        yield WorkingSet(client)
    finally:
        await client.aclose()


async def _insert(store: Store, rows: list[JobRow]) -> None:
    await store.insert_jobs(rows)
    async with store.transaction() as tx:  # insert_jobs writes new jobs' columns only
        for r in rows:
            await tx.execute(
                "UPDATE jobs SET status = ?, finished_at = ?, dead_reason = ?, result = ? WHERE id = ?",
                (r.status, r.finished_at, r.dead_reason, r.result, r.id),
            )


async def _ids_left(store: Store) -> set[str]:
    async with store.transaction() as tx:
        return {str(r[0]) for r in await tx.execute("SELECT id FROM jobs")}


class _Owner:
    """Ownership as the pruner's loop sees it: the shard is held."""

    def __init__(self, shard: int) -> None:
        self.epochs = {shard: 1}


async def _one_pass(store: Store, working_set: WorkingSet, shard: int, policy: RetentionPolicy) -> Pruner:
    pruner = Pruner(shard, Retention(store, policy, SHARDS), working_set, _Owner(shard))  # type: ignore[arg-type]
    await pruner._step(1)
    return pruner


async def test_a_pass_deletes_exactly_the_rows_past_their_period(
    store: Store, working_set: WorkingSet
) -> None:
    policy = RetentionPolicy(succeeded_s=7 * 86_400, dead_s=30 * 86_400, batch=3)
    job_type = "mail.send"
    other = next(
        t for t in (f"other.{i}" for i in range(100)) if shard_for(t, SHARDS) == shard_for(job_type, SHARDS)
    )
    old = [
        _row(job_type, "succeeded", 8),
        _row(job_type, "succeeded", 9, key="k-old"),
        _row(job_type, "cancelled", 7.5),
        _row(job_type, "dead", 31),
        *[_row(other, "succeeded", 10) for _ in range(7)],  # more than a batch
    ]
    kept = [
        _row(job_type, "succeeded", 6),
        _row(job_type, "cancelled", 1),
        _row(job_type, "dead", 29),  # a dead job keeps its longer period
        _row(job_type, "dead", 10),
        *[_row(job_type, status, None) for status in ("ready", "delayed", "leased")],
        _row(job_type, "ready", None),
    ]
    await _insert(store, old + kept)
    pruner = await _one_pass(store, working_set, shard_for(job_type, SHARDS), policy)
    assert await _ids_left(store) == {r.id for r in kept}
    assert pruner.pruned_total == len(old)
    # The dead-letter counts the triggers keep followed the deletes.
    assert (await store.dead_counts()).get((job_type, 1)) == 2


async def test_active_rows_are_never_deleted_even_with_an_old_finished_at(
    store: Store, working_set: WorkingSet
) -> None:
    """A requeued dead job (delayed, ready) may carry any times: only the status decides."""
    rows = [_row("t.active", status, 100) for status in ("ready", "delayed", "leased")]
    await _insert(store, rows)
    await _one_pass(store, working_set, shard_for("t.active", SHARDS), RetentionPolicy())
    assert await _ids_left(store) == {r.id for r in rows}


async def test_a_row_whose_record_redis_still_holds_waits_for_its_forget(
    store: Store, working_set: WorkingSet
) -> None:
    job_type = "t.unforgotten"
    shard = shard_for(job_type, SHARDS)
    held, free = _row(job_type, "succeeded", 30), _row(job_type, "succeeded", 30)
    await _insert(store, [held, free])
    # The finished record the status writer keeps until its commit is on disk (forget_jobs drops it).
    record = JobRecord(job_type, Priority.DEFAULT, JobState.SUCCEEDED, 1, 1, 5, 60_000, attempts=1)
    await working_set.redis.hset(ShardKeys(shard).jobs, held.id, record.pack())
    await _one_pass(store, working_set, shard, RetentionPolicy())
    assert await _ids_left(store) == {held.id}
    await working_set.forget(shard, [held.id])
    await _one_pass(store, working_set, shard, RetentionPolicy())
    assert await _ids_left(store) == set()


async def test_a_type_s_own_periods_override_the_cluster_s(store: Store, working_set: WorkingSet) -> None:
    short, long, plain = "t.short", "t.long", "t.plain"
    await store.put_queue_settings(
        short, QueueSettings(short, retain_finished_s=3600, retain_dead_s=86_400).to_json()
    )
    await store.put_queue_settings(long, QueueSettings(long, retain_finished_s=90 * 86_400).to_json())
    rows = {
        "short_done_2h": _row(short, "succeeded", 2 / 24),
        "short_dead_2d": _row(short, "dead", 2),
        "short_done_30m": _row(short, "succeeded", 0.5 / 24),
        "long_done_60d": _row(long, "succeeded", 60),
        "long_dead_31d": _row(long, "dead", 31),  # its dead period is the cluster's
        "plain_done_8d": _row(plain, "succeeded", 8),
    }
    await _insert(store, list(rows.values()))
    for job_type in (short, long, plain):
        await _one_pass(store, working_set, shard_for(job_type, SHARDS), RetentionPolicy())
    left = await _ids_left(store)
    assert left == {rows["short_done_30m"].id, rows["long_done_60d"].id}


async def test_the_operator_prune_counts_then_deletes_in_bounded_calls(
    store: Store, working_set: WorkingSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [_row("t.prune", "succeeded", 2) for _ in range(25)] + [
        _row("t.prune", "dead", 2) for _ in range(5)
    ]
    fresh = _row("t.prune", "succeeded", 0.5)
    await _insert(store, [*rows, fresh])
    policy = RetentionPolicy(batch=4, pause_ms=0)
    args = (store, working_set, policy, SHARDS, 86_400)
    assert await prune_older_than(
        *args, None, ["succeeded", "cancelled", "dead"], dry_run=True, max_rows=10
    ) == (
        30,
        False,
    )
    assert len(await _ids_left(store)) == 31  # a dry run deletes nothing
    assert await prune_older_than(*args, ["t.prune"], ["dead"], dry_run=False, max_rows=100) == (5, False)
    deleted, more = await prune_older_than(*args, None, ["succeeded"], dry_run=False, max_rows=10)
    assert (deleted, more) == (10, True)
    while more:
        n, more = await prune_older_than(*args, None, ["succeeded"], dry_run=False, max_rows=10)
        deleted += n
    assert deleted == 25
    assert await _ids_left(store) == {fresh.id}


async def test_finished_types_lists_each_type_with_finished_rows_once(store: Store) -> None:
    await _insert(store, [_row(t, s, 1) for t in ("a", "b", "c") for s in ("succeeded", "dead")])
    await _insert(store, [_row("d", "ready", None)])
    assert await store.finished_types() == ["a", "b", "c"]


assert pruner_module.STATUSES == ("succeeded", "cancelled", "dead")


async def test_a_requeue_reports_only_the_dead_rows_it_requeued(store: Store) -> None:
    """A requeue reads dead rows, then requeues them: one pruned in between is not pushed to Redis
    (it would run with no row to record its status)."""
    kept, pruned = _row("t.requeue", "dead", 40), _row("t.requeue", "dead", 40)
    await _insert(store, [kept, pruned])
    assert await store.delete_finished([pruned.id], "dead", wall_ms()) == 1
    assert await store.requeue_dead([kept.id, pruned.id], wall_ms()) == {kept.id}


async def test_the_jobs_table_size_follows_its_rows(store: Store) -> None:
    """``shardq_db_table_bytes`` reads ``table_bytes``: the jobs table grows by at least the payloads
    of the rows inserted (PostgreSQL: table, TOAST and indexes, partitions included; SQLite: the
    database file)."""
    from dataclasses import replace

    table = "jobs" if store.backend == "postgres" else "file"
    before = (await store.table_bytes())[table]
    assert before > 0
    payload = bytes(range(256)) * 4  # 1 KiB that compresses poorly
    await store.insert_jobs([replace(_row("size.t", "succeeded", 1), payload=payload) for _ in range(2000)])
    assert (await store.table_bytes())[table] >= before + 2000 * len(payload)
