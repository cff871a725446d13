"""The time partitions of the jobs table on a real PostgreSQL, with a real Redis: created ahead,
idempotently and by one process at a time; rows the default partition took moved into their
partition; a partition retired on time, never with an unfinished, still retained or Redis-held row
(those survive in its kept partition), its dead counts and idempotency keys following; keys unique
across partitions; and the migration of a populated table keeping every row, key and index.

Time is driven by the ids: rows made with ids_from(an old millisecond) belong to the partition of
that day, and the keeper is handed the "now" of its pass."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
import redis.asyncio as aredis

from dispatcher.config import PartitionPolicy, RetentionPolicy
from dispatcher.queue.flow import QueueSettings
from dispatcher.queue.ids import ids_from, new_job_ids
from dispatcher.queue.keys import ShardKeys
from dispatcher.queue.pruner import Pruner, Retention
from dispatcher.queue.table_keeper import TableKeeper
from dispatcher.queue.working_set import WorkingSet
from dispatcher.store import JobRow, Store, open_store
from dispatcher.store.partitions import KEEPER_LOCK_KEY, PartitionQueries
from shardmap import shard_for
from shardq_common.clock import wall_ms

pytestmark = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
SHARDS = 8
DAY = 86_400_000
TYPE = "mail.send"


def _row(
    job_id: str, status: str, finished_at: int | None = None, *, key: str | None = None, job_type: str = TYPE
) -> JobRow:
    return JobRow(
        id=job_id, type=job_type, shard=shard_for(job_type, SHARDS), priority=1, payload=b"{}",
        status=status, run_at=1, lease_until=None, attempts=1, failures=0, expirations=0,
        max_attempts=5, lease_ttl_ms=60_000, idem_key=key, last_error=None,
        dead_reason="failed" if status == "dead" else None, result=None, enqueued_at=1, started_at=None,
        finished_at=finished_at, updated_at=1,
    )  # fmt: skip


def _ids(at_ms: int, n: int) -> list[str]:
    return ids_from(at_ms, os.urandom(16 * n))


@pytest.fixture
async def working_set(redis_url: str) -> AsyncIterator[WorkingSet]:
    client = aredis.from_url(redis_url)
    try:
        yield WorkingSet(client)
    finally:
        await client.aclose()


def _keeper(store: Store, working_set: WorkingSet, **policy: Any) -> TableKeeper:
    retention = Retention(store, RetentionPolicy(), SHARDS)
    return TableKeeper(store, working_set, retention, PartitionPolicy(**policy), SHARDS)


async def _insert(store: Store, rows: list[JobRow]) -> None:
    """As the hot path leaves them: inserted new, then their status written."""
    async with store.transaction() as tx:
        await tx.insert_new_jobs([r.new_job_values() for r in rows])
    async with store.transaction() as tx:
        for r in rows:
            await tx.execute(
                "UPDATE jobs SET status = ?, finished_at = ?, dead_reason = ? WHERE id = ?",
                (r.status, r.finished_at, r.dead_reason, r.id),
            )


async def _where(store: Store) -> dict[str, str]:
    """id -> the partition holding its row."""
    async with store.transaction() as tx:
        return {
            str(r[1]): str(r[0]) for r in await tx.execute("SELECT tableoid::regclass::text, id FROM jobs")
        }


def _partitioned(store: Store) -> PartitionQueries:
    assert isinstance(store, PartitionQueries)
    return store


async def test_partitions_are_created_ahead_once_by_one_process_at_a_time(
    store: Store, working_set: WorkingSet, db_url: str
) -> None:
    now = wall_ms()
    keeper = _keeper(store, working_set, ahead=3)
    other = await open_store(db_url)
    try:
        # Two processes at once: each range is created once, whoever does it.
        results = await asyncio.gather(
            keeper.ensure_ahead(now), _keeper(other, working_set, ahead=3).ensure_ahead(now)
        )
        created = [name for r in results if r for name in r]
        assert len(created) == len(set(created)) == 4  # the current day and 3 ahead
        assert await keeper.ensure_ahead(now) == []  # idempotent
        names = [p.name for p in await _partitioned(store).partitions() if p.fresh]
        assert sorted(names) == sorted(created)
        # Held by another process: this one leaves it to it.
        with psycopg.connect(db_url, autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(%s)", (KEEPER_LOCK_KEY,))
            assert await keeper.ensure_ahead(now + 10 * DAY) is None
            holder.execute("SELECT pg_advisory_unlock(%s)", (KEEPER_LOCK_KEY,))
        # A day later, one more partition ahead.
        assert len(await keeper.ensure_ahead(now + DAY) or []) == 1
        # Every new id lands in a day partition, never in the default one.
        await store.insert_jobs([_row(new_job_ids(1)[0], "ready")])
        assert all(p.startswith("jobs_p") for p in (await _where(store)).values())
    finally:
        await other.close()


async def test_rows_the_default_partition_took_move_into_the_partition_made_for_them(
    store: Store, working_set: WorkingSet
) -> None:
    old = wall_ms() - 20 * DAY
    ids = _ids(old, 3)
    await _insert(
        store, [_row(ids[0], "dead", old, key="k"), _row(ids[1], "ready"), _row(ids[2], "succeeded", old)]
    )
    assert set((await _where(store)).values()) == {"jobs_default"}
    assert await _partitioned(store).ensure_partitions(old, old, DAY)
    assert set((await _where(store)).values()) == {f"jobs_p{_day_name(old)}"}
    # Moved, not deleted and inserted again: the dead count and the key are as they were.
    assert await store.dead_counts() == {(TYPE, 1): 1}
    assert await store.insert_jobs([_row(new_job_ids(1)[0], "ready", key="k")]) == [(ids[0], False)]


def _day_name(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp((ms - ms % DAY) / 1000, UTC).strftime("%Y%m%dt0000")


async def test_a_partition_is_retired_on_time_and_never_with_a_row_that_survives(
    store: Store, working_set: WorkingSet
) -> None:
    now = wall_ms()
    keeper = _keeper(store, working_set)
    await _partitioned(store).ensure_partitions(now - 12 * DAY, now, DAY)
    day10, day5 = now - 10 * DAY, now - 5 * DAY
    ids = _ids(day10, 20)
    gone = [
        *[_row(i, "succeeded", now - 9 * DAY) for i in ids[10:]],  # most rows: survivors are few
        _row(ids[0], "succeeded", day10 + 1000),
        _row(ids[1], "succeeded", now - 8 * DAY, key="kept-key-gone"),
        _row(ids[2], "cancelled", now - 7 * DAY - 60_000),
        _row(ids[3], "dead", now - 31 * DAY),  # finished before it was made: past its 30 days
    ]
    survivors = [
        _row(ids[4], "dead", now - 9 * DAY, key="dead-key"),  # within its 30 days
        _row(ids[5], "ready"),
        _row(ids[6], "delayed"),
        _row(ids[7], "leased"),
        _row(ids[8], "succeeded", now - 9 * DAY),  # past, but its record is still in Redis
        _row(ids[9], "succeeded", now - 2 * DAY),  # finished late (retried for days): not past
    ]
    young = [_row(i, "succeeded", now - 2 * DAY) for i in _ids(day5, 2)]
    await _insert(store, gone + survivors + young)
    await working_set.redis.hset(ShardKeys(shard_for(TYPE, SHARDS)).jobs, ids[8], b"record")
    dead_before = await store.dead_counts()

    done = {name: r.outcome for name, r in await keeper.pass_once(now)}
    # The empty days past their period are dropped; the day with rows is compacted; the days not
    # past it yet stay.
    assert done == {
        **{f"jobs_p{_day_name(now - d * DAY)}": "dropped" for d in (12, 11, 9, 8)},
        f"jobs_p{_day_name(day10)}": "compacted",
    }
    where = await _where(store)
    assert {i: where[i] for i in ids[:10] if i in where} == {
        r.id: f"jobs_p{_day_name(day10)}_kept" for r in survivors
    }
    assert {where[r.id] for r in young} == {f"jobs_p{_day_name(day5)}"}
    assert await store.dead_counts() == {(TYPE, 1): dead_before[(TYPE, 1)] - 1}
    # The deleted job's key is free again; the survivor's is still held.
    fresh = new_job_ids(2)
    out = await store.insert_jobs(
        [_row(fresh[0], "ready", key="kept-key-gone"), _row(fresh[1], "ready", key="dead-key")]
    )
    assert out == [(fresh[0], True), (ids[4], False)]

    # A pass later, nothing else is due: the kept partition still has survivors.
    assert await keeper.pass_once(now) == []
    # Once its jobs finished long ago, Redis forgot them and the dead one is past its 30 days, the
    # kept partition goes too.
    async with store.transaction() as tx:
        await tx.execute(
            "UPDATE jobs SET status = 'succeeded', finished_at = ? WHERE id IN (?, ?, ?)",
            (now - 9 * DAY, ids[5], ids[6], ids[7]),
        )
        # A job of the partition that waited for another (migration 0016): its edge goes with it.
        await tx.execute(
            "INSERT INTO job_dependencies (job_id, depends_on_id, on_failure, resolved_state) "
            "VALUES (?, ?, 'fail', 'succeeded')",
            (ids[5], ids[6]),
        )
    await working_set.redis.hdel(ShardKeys(shard_for(TYPE, SHARDS)).jobs, ids[8])
    later = now + 22 * DAY
    done = {name: r.outcome for name, r in await keeper.pass_once(later)}
    assert done[f"jobs_p{_day_name(day10)}_kept"] == "dropped"
    assert not set(ids[:10]) & set(await _where(store))
    async with store.transaction() as tx:
        assert await tx.execute("SELECT count(*) FROM job_idem_keys WHERE job_id = ?", (ids[4],)) == [(0,)]
        assert await tx.execute("SELECT count(*) FROM job_dependencies WHERE job_id = ?", (ids[5],)) == [(0,)]


async def test_the_row_pruner_leaves_a_partition_retired_whole_to_its_retirement(
    store: Store, working_set: WorkingSet
) -> None:
    now = wall_ms()
    await _partitioned(store).ensure_partitions(now - 12 * DAY, now, DAY)
    in_partition = _ids(now - 10 * DAY, 2)
    await _insert(
        store,
        [
            _row(in_partition[0], "succeeded", now - 9 * DAY),
            _row(in_partition[1], "succeeded", now - 9 * DAY, job_type="short.lived"),
            _row("zz-no-partition-covers-it", "succeeded", now - 9 * DAY),  # the default partition's
        ],
    )
    await store.put_queue_settings(
        "short.lived", QueueSettings("short.lived", retain_finished_s=3600).to_json()
    )
    retention = Retention(store, RetentionPolicy(), SHARDS)

    class _Owner:
        epochs = dict.fromkeys(range(SHARDS), 1)

    for shard in {shard_for(TYPE, SHARDS), shard_for("short.lived", SHARDS)}:
        await Pruner(shard, retention, working_set, _Owner())._step(1)  # type: ignore[arg-type]
    # The cluster's period: left to the partition; a shorter one and the default partition's: pruned.
    assert set(await _where(store)) == {in_partition[0]}


async def test_idempotency_keys_are_unique_across_partitions(
    store: Store, working_set: WorkingSet, db_url: str
) -> None:
    now = wall_ms()
    await _partitioned(store).ensure_partitions(now - 6 * DAY, now, DAY)
    old = _ids(now - 5 * DAY, 1)[0]
    await _insert(store, [_row(old, "succeeded", now - 4 * DAY, key="order-1")])
    new = new_job_ids(2)
    # The RPC's path, and another type's key of the same name.
    assert await store.insert_jobs([_row(new[0], "ready", key="order-1")]) == [(old, False)]
    assert await store.insert_jobs([_row(new[1], "ready", key="order-1", job_type="other")]) == [
        (new[1], True)
    ]
    # The SQL functions of migrations 0008 and 0010.
    await store.ensure_shard_count(SHARDS)
    await store.record_enqueue_settings(
        {"max_payload_bytes": 1 << 20, "max_attempts": 5, "lease_ttl_ms": 60_000, "max_batch": 100}
    )
    with psycopg.connect(db_url, autocommit=True) as c:
        assert c.execute(
            "SELECT shardq_enqueue_v1(%s, ''::bytea, idempotency_key => 'order-1')", (TYPE,)
        ).fetchone() == (old,)
        assert c.execute(
            "SELECT shardq_enqueue_v2(%s, ''::bytea, idempotency_key => 'order-1')", (TYPE,)
        ).fetchone() == (old,)
        many = c.execute(
            "SELECT shardq_enqueue_many_v2(ARRAY[%s, %s], ARRAY[''::bytea, ''::bytea], "
            "idempotency_keys => ARRAY['order-1', 'order-2'])",
            (TYPE, TYPE),
        ).fetchone()
        assert many is not None and many[0][0] == old and many[0][1] != old
    # Two transactions racing for one key, in different partitions: the second waits, then yields.
    with psycopg.connect(db_url) as first, psycopg.connect(db_url, autocommit=True) as second:
        first.execute(
            "INSERT INTO jobs (id, type, shard, priority, payload, status, run_at, max_attempts, "
            "lease_ttl_ms, idem_key, enqueued_at, updated_at) "
            "VALUES (%s, %s, 0, 1, '', 'ready', 1, 5, 1000, 'race', 1, 1)",
            (_ids(now - 5 * DAY, 1)[0], TYPE),
        )

        def _second() -> int:
            cur = second.execute(
                "INSERT INTO jobs (id, type, shard, priority, payload, status, run_at, max_attempts, "
                "lease_ttl_ms, idem_key, enqueued_at, updated_at) VALUES (%s, %s, 0, 1, '', 'ready', 1, 5, "
                "1000, 'race', 1, 1) ON CONFLICT DO NOTHING",
                (new_job_ids(1)[0], TYPE),
            )
            return cur.rowcount

        racing = asyncio.get_running_loop().run_in_executor(None, _second)
        await asyncio.sleep(0.3)
        assert not racing.done()  # waiting for the first transaction's claim
        first.commit()
        assert await asyncio.wait_for(racing, 10) == 0
    async with store.transaction() as tx:
        assert await tx.execute("SELECT count(*) FROM jobs WHERE idem_key = 'race'") == [(1,)]
    # Deleted by retention, the job frees its key.
    assert await store.delete_finished([old], "succeeded", now) == 1
    again = new_job_ids(1)[0]
    assert await store.insert_jobs([_row(again, "ready", key="order-1")]) == [(again, True)]


async def test_the_migration_of_a_populated_table_keeps_every_row_key_index_and_function(
    db_url: str, working_set: WorkingSet
) -> None:
    store = await open_store(db_url)
    try:
        await store.migrate(before="0014")
        await store.ensure_shard_count(SHARDS)
        await store.record_enqueue_settings(
            {"max_payload_bytes": 1 << 20, "max_attempts": 5, "lease_ttl_ms": 60_000, "max_batch": 100}
        )
        now = wall_ms()
        statuses = ["delayed", "ready", "leased", "succeeded", "cancelled", "dead"]
        finished = ("succeeded", "cancelled", "dead")
        rows = [
            _row(job_id, statuses[i % 6], now - DAY if statuses[i % 6] in finished else None,
                 key=f"key-{day}-{i}" if i % 3 == 0 else None, job_type=f"type.{i % 4}")
            for day in (40, 9, 1, 0)
            for i, job_id in enumerate(_ids(now - day * DAY, 30))
        ]  # fmt: skip
        future = _row(_ids(now + 3 * DAY, 1)[0], "ready", key="from-the-future")  # a clock far ahead
        await _insert(store, [*rows, future])
        with psycopg.connect(db_url, autocommit=True) as c:
            # 0013's indexes are there (a migration numbered before 0014), and an operator's own.
            c.execute("CREATE INDEX jobs_payload_len ON jobs ((length(payload))) WHERE status = 'dead'")
            before = c.execute("SELECT * FROM jobs ORDER BY id").fetchall()
            indexes = {r[0] for r in c.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'jobs'")}
            dead = await store.dead_counts()

        assert await store.migrate(before="0016") == [
            "0014_partitioned_jobs.postgres.sql",
            "0015_idem_key_lookup.postgres.sql",
        ]

        with psycopg.connect(db_url, autocommit=True) as c:
            assert c.execute("SELECT * FROM jobs ORDER BY id").fetchall() == before
            assert c.execute("SELECT relkind FROM pg_class WHERE relname = 'jobs'").fetchone() == ("p",)
            where = dict(c.execute("SELECT id, tableoid::regclass::text FROM jobs").fetchall())
            assert where.pop(future.id) == "jobs_default"
            assert set(where.values()) == {"jobs_legacy"}
            # Every index but the unique key's is on the partitioned table, under its name; the
            # legacy partition's own were adopted (one per parent index, none built twice).
            after = {r[0] for r in c.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'jobs'")}
            assert after == indexes - {"jobs_idem_key"}
            legacy = c.execute("SELECT count(*) FROM pg_indexes WHERE tablename = 'jobs_legacy'").fetchone()
            assert legacy == (len(after),)
            keys = c.execute("SELECT type, idem_key, job_id FROM job_idem_keys ORDER BY 1, 2").fetchall()
            assert keys == sorted((r.type, r.idem_key, r.id) for r in [*rows, future] if r.idem_key)
            # The SQL functions of 0008 and 0010 still enqueue, and see the keys made before.
            old_key = next(r for r in rows if r.idem_key)
            assert c.execute(
                "SELECT shardq_enqueue_v1(%s, ''::bytea, idempotency_key => %s)",
                (old_key.type, old_key.idem_key),
            ).fetchone() == (old_key.id,)
            made = c.execute(
                "SELECT shardq_enqueue_v2('type.0', 'x'::bytea, headers => '{\"a\": \"b\"}')"
            ).fetchone()
            assert made is not None and c.execute(
                "SELECT status, headers FROM jobs WHERE id = %s", made
            ).fetchone() == (
                "ready",
                '{"a":"b"}',
            )
        assert await store.dead_counts() == dead
        # The keys are enforced for the RPC's path too, and the triggers count the dead still.
        fresh = new_job_ids(2)
        assert await store.insert_jobs(
            [_row(fresh[0], "ready", key=old_key.idem_key, job_type=old_key.type)]
        ) == [(old_key.id, False)]
        await _insert(store, [_row(fresh[1], "dead", now)])
        assert (await store.dead_counts())[(TYPE, 1)] == dead.get((TYPE, 1), 0) + 1
        # The keeper takes it from there: the day partitions go after the legacy one.
        created = await _keeper(store, working_set).ensure_ahead(now)
        assert created and all(name.startswith("jobs_p") for name in created)
    finally:
        await store.close()


async def test_a_bound_checked_beforehand_spares_the_migration_a_read_of_the_table(db_url: str) -> None:
    store = await open_store(db_url)
    try:
        await store.migrate(before="0014")
        now = wall_ms()
        rows = [_row(i, "succeeded", now) for i in _ids(now - DAY, 5)]
        await _insert(store, rows)
        bound = _ids(now + 5 * DAY, 1)[0][:10]
        with psycopg.connect(db_url, autocommit=True) as c:
            # As docs/operations.md has an operator do it online, before the upgrade.
            c.execute(f"ALTER TABLE jobs ADD CONSTRAINT jobs_legacy_bound CHECK (id < '{bound}') NOT VALID")
            c.execute("ALTER TABLE jobs VALIDATE CONSTRAINT jobs_legacy_bound")
        await store.migrate()
        assert {p.name: (p.lo, p.hi) for p in await _partitioned(store).partitions() if not p.default} == {
            "jobs_legacy": (None, bound)
        }
        assert set((await _where(store)).values()) == {"jobs_legacy"}
        # The bound is the legacy partition's, not the table's: a later id goes in.
        later = _ids(now + 6 * DAY, 1)[0]
        await _insert(store, [_row(later, "ready")])
        assert (await _where(store))[later] == "jobs_default"
    finally:
        await store.close()


async def test_rows_that_change_while_a_partition_retires_are_kept_in_their_last_version(
    store: Store, working_set: WorkingSet
) -> None:
    now = wall_ms()
    await _partitioned(store).ensure_partitions(now - 11 * DAY, now - 9 * DAY, DAY)
    day10 = now - 10 * DAY
    ids = _ids(day10, 24)
    requeued, finishing, purged, late = ids[0], ids[1], ids[2], ids[3]
    await _insert(
        store,
        [
            _row(requeued, "dead", now - 40 * DAY),  # past its 30 days: not copied, then requeued
            _row(finishing, "leased"),  # copied as leased, then it succeeds
            _row(purged, "dead", now - 9 * DAY, key="purged-key"),  # copied, then purged
            *[_row(i, "succeeded", now - 9 * DAY) for i in ids[4:]],
        ],
    )
    partition = next(p for p in await _partitioned(store).partitions() if p.lo_ms == day10 - day10 % DAY)

    async def meanwhile() -> None:
        assert await store.requeue_dead([requeued], now) == {requeued}
        async with store.transaction() as tx:
            await tx.execute(
                "UPDATE jobs SET status = 'succeeded', finished_at = ? WHERE id = ?", (now, finishing)
            )
            await tx.execute("DELETE FROM jobs WHERE id = ?", (purged,))
        # An occurrence materialized late, its id in the retiring range.
        await _insert(store, [_row(late, "delayed")])

    cutoffs = await _keeper(store, working_set).cutoffs(now)
    result = await _partitioned(store).retire_partition(
        partition, cutoffs, [], max_share=0.5, before_swap=meanwhile
    )
    assert result.outcome == "compacted"
    async with store.transaction() as tx:
        left = dict(
            await tx.execute(
                "SELECT id, status FROM jobs WHERE id >= ? AND id < ?", (partition.lo, partition.hi)
            )
        )
        dead = await tx.execute("SELECT count(*) FROM jobs WHERE status = 'dead'")
    assert left == {requeued: "delayed", finishing: "succeeded", late: "delayed"}
    # The dead counts agree with the rows: the requeue and the purge counted themselves.
    assert sum((await store.dead_counts()).values()) == dead[0][0] == 0
    fresh = new_job_ids(1)[0]
    assert await store.insert_jobs([_row(fresh, "ready", key="purged-key")]) == [(fresh, True)]
