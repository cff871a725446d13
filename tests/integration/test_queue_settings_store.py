"""Migration 0007 (flow control) on both stores: it adds the jobs' concurrency key and RateLimited
count to a table that holds rows (the rows stay, with no key and a count of 0), and the queue
settings table with its store methods."""

from __future__ import annotations

import itertools

from dispatcher.queue.flow import QueueSettings, Rate
from dispatcher.queue.states import Priority
from dispatcher.store import JobRow, StoreUpdate, open_store

from .test_store_limits import _migrate_before

FLOW = "0007_flow_control.sql"
_ids = itertools.count()


def _row(key: str | None = None) -> JobRow:
    return JobRow(
        id=f"job-{next(_ids):06d}", type="t", shard=0, priority=1, payload=b"{}", status="ready",
        run_at=1, lease_until=None, attempts=0, failures=0, expirations=0, max_attempts=5,
        lease_ttl_ms=60_000, idem_key=None, last_error=None, dead_reason=None, result=None,
        enqueued_at=1, started_at=None, finished_at=None, updated_at=1, concurrency_key=key,
    )  # fmt: skip


async def test_the_migration_adds_the_columns_to_a_table_with_rows_and_keeps_them(db_url: str) -> None:
    store = await open_store(db_url)
    try:
        await _migrate_before(store, FLOW)  # the schema before flow control, with jobs in it
        async with store.transaction() as tx:
            for i in range(3):
                await tx.execute(
                    "INSERT INTO jobs (id, type, shard, priority, payload, status, run_at, max_attempts, "
                    "lease_ttl_ms, enqueued_at, updated_at) "
                    "VALUES (?, 'old.type', 0, 1, ?, 'ready', 1, 3, 60000, 1, 1)",
                    (f"old-{i}", b"{}"),
                )
        applied = await store.migrate()
        assert applied[0] == FLOW and all(name > FLOW for name in applied[1:]), applied  # and the later ones
        rows = await store.get_jobs([f"old-{i}" for i in range(3)])
        assert sorted(r.id for r in rows) == ["old-0", "old-1", "old-2"]
        assert all(r.concurrency_key is None and r.rate_limited == 0 for r in rows)
        assert await store.list_queue_settings() == []
    finally:
        await store.close()


async def test_jobs_keep_their_concurrency_key_and_rate_limited_count(db_url: str) -> None:
    store = await open_store(db_url)
    try:
        await store.migrate()
        keyed, plain = _row("tenant-a"), _row()
        many = [_row(f"tenant-{i % 7}") for i in range(300)]  # the bulk path (COPY on PostgreSQL)
        await store.insert_jobs([keyed, plain])
        await store.insert_jobs(many)
        got = {r.id: r for r in await store.get_jobs([keyed.id, plain.id, many[10].id])}
        assert got[keyed.id].concurrency_key == "tenant-a"
        assert got[plain.id].concurrency_key is None
        assert got[many[10].id].concurrency_key == "tenant-3"

        # A RateLimited retry writes its count; a later update that leaves it unset keeps it.
        await store.apply_updates([StoreUpdate(keyed.id, "delayed", run_at=5, attempts=0, rate_limited=2)])
        await store.apply_updates([StoreUpdate(keyed.id, "leased", lease_until=9, attempts=1)])
        row = await store.get_job(keyed.id)
        assert row is not None and row.rate_limited == 2 and row.status == "leased"
    finally:
        await store.close()


async def test_queue_settings_round_trip(db_url: str) -> None:
    store = await open_store(db_url)
    try:
        await store.migrate()
        wanted = QueueSettings(
            "mail.send",
            paused=frozenset({Priority.LOW}),
            concurrency=5,
            key_concurrency=2,
            key_concurrency_overrides={"big": 10},
            key_weights={"big": 3},
            rate=Rate(100.0, 20),
            key_rate=Rate(0.5, 1),
        )
        await store.put_queue_settings("mail.send", wanted.to_json())
        row = await store.get_queue_settings("mail.send")
        assert row is not None and QueueSettings.from_json("mail.send", row.settings) == wanted
        assert [r.job_type for r in await store.list_queue_settings()] == ["mail.send"]

        def pause_all(old: dict | None) -> dict:
            assert old is not None
            return {**old, "paused": ["high", "default", "low"]}

        old, new = await store.update_queue_settings("mail.send", pause_all)
        assert old == wanted.to_json() and new is not None
        row = await store.get_queue_settings("mail.send")
        assert row is not None and QueueSettings.from_json("mail.send", row.settings).paused == frozenset(
            Priority
        )

        assert await store.delete_queue_settings("mail.send")
        assert await store.get_queue_settings("mail.send") is None
        assert not await store.delete_queue_settings("mail.send")
    finally:
        await store.close()
