"""What a job type or a schedule name leaves behind is removed by the retention pass's type sweep,
against a real Redis and a real store (SQLite and PostgreSQL): a type with no job in any state and
no settings loses its ``keyed``/``kvt``/``kcfg`` fields (a type with a row, an active job or settings
keeps them, and a job arriving just before the sweep's script keeps them too), a type's per-key
gates past their time go after its per-key rate was removed, the ``dead_counts`` rows at 0 go, and
a retired schedule version goes once no job carries its name and its hour is over."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
import redis.asyncio as aredis

from dispatcher.config import RetentionPolicy
from dispatcher.queue.flow import QueueSettings, Rate
from dispatcher.queue.keys import ShardKeys
from dispatcher.queue.pruner import Pruner, Retention
from dispatcher.queue.records import JobRecord
from dispatcher.queue.states import JobState, Priority
from dispatcher.queue.working_set import NewJob, WorkingSet
from dispatcher.store import JobRow, Store
from dispatcher.store.schedules import ScheduleRow
from shardmap import shard_for
from shardq_common.clock import steady_ms, wall_ms

SHARDS = 16
DAY_MS = 86_400_000
_serial = itertools.count()


def _type_in(shard: int, prefix: str) -> str:
    return next(t for t in (f"{prefix}.{i}" for i in range(10_000)) if shard_for(t, SHARDS) == shard)


def _job(job_type: str, now: int, key: str = "", prio: int = 1) -> NewJob:
    record = JobRecord(job_type, Priority(prio), JobState.READY, now, now, 3, 60_000, concurrency_key=key)
    return NewJob(f"left-{next(_serial):06d}", record, b"p")


def _row(job_type: str, status: str, finished_days_ago: float, schedule: str | None = None) -> JobRow:
    now = wall_ms()
    return JobRow(
        id=f"row-{next(_serial):06d}", type=job_type, shard=shard_for(job_type, SHARDS), priority=1,
        payload=b"{}", status=status, run_at=1, lease_until=None, attempts=1, failures=0, expirations=0,
        max_attempts=5, lease_ttl_ms=60_000, idem_key=None, last_error=None,
        dead_reason="failed" if status == "dead" else None, result=None, enqueued_at=1, started_at=None,
        finished_at=int(now - finished_days_ago * DAY_MS), updated_at=1, schedule=schedule,
    )  # fmt: skip


async def _insert(store: Store, rows: list[JobRow]) -> None:
    await store.insert_jobs(rows)
    async with store.transaction() as tx:  # insert_jobs writes new jobs' columns only
        for r in rows:
            await tx.execute(
                "UPDATE jobs SET status = ?, finished_at = ?, dead_reason = ?, schedule = ? WHERE id = ?",
                (r.status, r.finished_at, r.dead_reason, r.schedule, r.id),
            )


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aredis.Redis]:
    c = aredis.from_url(redis_url)
    try:
        yield c
    finally:
        await c.aclose()


class _Owner:
    def __init__(self, shard: int) -> None:
        self.epochs = {shard: 1}


async def _pass(store: Store, ws: WorkingSet, shard: int) -> None:
    policy = RetentionPolicy(succeeded_s=7 * 86_400, dead_s=30 * 86_400)
    pruner = Pruner(shard, Retention(store, policy, SHARDS), ws, _Owner(shard))  # type: ignore[arg-type]
    await pruner._step(1)


async def _run_keyed_job(ws: WorkingSet, shard: int, job_type: str, now: int, key: str) -> None:
    """A keyed job of the type enqueued, leased and acked: it leaves the type's fields behind."""
    await ws.enqueue(shard, 1, now, [_job(job_type, now, key)])
    (grant,) = (await ws.lease(shard, 1, now, [job_type], [1], holder="w")).grants
    await ws.ack(shard, now, [(grant.id, grant.token)])


async def _fields(client: aredis.Redis, k: ShardKeys) -> set[str]:
    """The types named by the shard's keyed, kvt and kcfg fields."""
    found = {n.decode() for n in await client.hkeys(k.keyed)}
    for per_class in (k.key_turns, k.key_settings_seen):
        found |= {n.decode().split(":", 1)[1] for n in await client.hkeys(per_class)}
    return found


async def test_a_type_with_no_job_anywhere_and_no_settings_leaves_no_fields(
    store: Store, client: aredis.Redis
) -> None:
    shard = 3
    k, ws = ShardKeys(shard), WorkingSet(client)
    now = steady_ms() - 60_000
    await ws.acquire(shard, 1, "owner", now, now + 10**9)
    idle, with_row, active, configured = (_type_in(shard, p) for p in ("idle", "row", "active", "conf"))
    await client.hset(k.flow, configured, QueueSettings(configured, key_concurrency=2).pack())
    for job_type in (idle, with_row, active, configured):
        await _run_keyed_job(ws, shard, job_type, now, "tenant-1")
    await ws.enqueue(shard, 1, now, [_job(active, now, "tenant-2")])  # still ready
    await _insert(store, [_row(with_row, "succeeded", 1)])  # retained: a row of the type
    assert await _fields(client, k) == {idle, with_row, active, configured}

    await _pass(store, ws, shard)
    assert await _fields(client, k) == {with_row, active, configured}
    # The type comes back: its fields start afresh and its jobs lease as before.
    await ws.enqueue(shard, 1, now, [_job(idle, now, "tenant-9")])
    grants = (await ws.lease(shard, 1, now, [idle, active], [1, 1], holder="w")).grants
    assert sorted(g.type for g in grants) == sorted([idle, active])


async def test_a_job_arriving_before_the_sweeps_script_keeps_the_fields(
    store: Store, client: aredis.Redis
) -> None:
    """The database said the type had no job; a job was pushed before the script ran: the script's
    own check keeps the fields, and the job leases."""
    shard = 3
    k, ws = ShardKeys(shard), WorkingSet(client)
    now = steady_ms() - 60_000
    await ws.acquire(shard, 1, "owner", now, now + 10**9)
    job_type = _type_in(shard, "late")
    await _run_keyed_job(ws, shard, job_type, now, "tenant-1")
    assert await store.types_without_rows([job_type]) == [job_type]
    await ws.enqueue(shard, 1, now, [_job(job_type, now, "tenant-2")])
    assert await ws.forget_types(shard, [job_type], [], steady_ms()) == []
    assert job_type in await _fields(client, k)
    assert len((await ws.lease(shard, 1, now, [job_type], [1], holder="w")).grants) == 1


async def test_key_gates_go_after_the_per_key_rate_is_removed(store: Store, client: aredis.Redis) -> None:
    shard = 3
    k, ws = ShardKeys(shard), WorkingSet(client)
    now = steady_ms() - 60_000
    await ws.acquire(shard, 1, "owner", now, now + 10**9)
    job_type = _type_in(shard, "rated")
    await client.hset(k.flow, job_type, QueueSettings(job_type, key_rate=Rate(1.0, 1)).pack())
    await ws.enqueue(shard, 1, now, [_job(job_type, now, f"key-{i}") for i in range(50)])
    leased = 0
    while leased < 50:
        leased += len((await ws.lease(shard, 1, now, [job_type], [1] * 50, holder="w")).grants)
    assert await client.zcard(k.key_gate(job_type)) == 50
    await client.hdel(k.flow, job_type)  # the per-key rate removed
    await ws.enqueue(shard, 1, now + 5000, [_job(job_type, now + 5000, "other")])
    await ws.lease(shard, 1, now + 5000, [job_type], [1], holder="w")
    await _pass(store, ws, shard)
    assert await client.zcard(k.key_gate(job_type)) == 0


async def test_dead_counts_at_zero_go_and_come_back_with_a_dead_job(
    store: Store, client: aredis.Redis
) -> None:
    job_type = _type_in(0, "dying")
    await _insert(store, [_row(job_type, "dead", 31)])  # past the dead period: the pass deletes it
    assert (await store.dead_counts()).get((job_type, 1)) == 1
    await _pass(store, WorkingSet(client), 0)
    async with store.transaction() as tx:
        left = await tx.execute("SELECT n FROM dead_counts WHERE type = ?", (job_type,))
    assert left == []
    await _insert(store, [_row(job_type, "dead", 1)])
    assert (await store.dead_counts()).get((job_type, 1)) == 1


async def test_a_retired_schedule_version_goes_once_no_job_carries_its_name(
    store: Store, client: aredis.Redis
) -> None:
    ws = WorkingSet(client)
    async with store.transaction() as tx:
        for name, version in (("gone", 3), ("kept", 2)):
            await tx.execute(
                "INSERT INTO retired_schedule_versions (name, version) VALUES (?, ?)", (name, version)
            )
    await _insert(store, [_row("report.daily", "succeeded", 1, schedule="kept")])
    await _pass(store, ws, 0)
    async with store.transaction() as tx:
        names = {r[0] for r in await tx.execute("SELECT name FROM retired_schedule_versions")}
    assert names == {"kept"}

    # One deleted now keeps its row for the hour, whatever its jobs; after it, a schedule created
    # again under the name starts at version 1 (no job of the name is left to collide with).
    spec = ScheduleRow(
        name="fresh", cron="* * * * *", timezone="UTC", type="report.daily", shard=0, payload=b"",
        priority=1, max_attempts=3, lease_ttl_ms=60_000, max_lag_ms=0, catch_up="none", enabled=True,
    )  # fmt: skip
    row, _, _ = await store.upsert_schedule(spec, True)
    row, _, _ = await store.upsert_schedule(replace(spec, cron="*/5 * * * *"), True)
    assert row.version == 2
    assert await store.delete_schedule("fresh")  # version 3, deleted
    (deleted,) = [r for r in await store.schedules_to_clean([0]) if r.name == "fresh"]
    await store.finish_cleanup(deleted, 0, None)
    await _pass(store, ws, 0)
    async with store.transaction() as tx:
        assert await tx.execute("SELECT version FROM retired_schedule_versions WHERE name = 'fresh'") == [
            (3,)
        ]
        await tx.execute("UPDATE retired_schedule_versions SET retired_at = retired_at - 3600001")
    await _pass(store, ws, 0)
    async with store.transaction() as tx:
        assert await tx.execute("SELECT version FROM retired_schedule_versions WHERE name = 'fresh'") == []
    row, created, _ = await store.upsert_schedule(spec, True)
    assert created and row.version == 1
