"""A schedule name never gets a version twice (both stores): an occurrence's job id is derived from
(name, version, time), so a schedule created again after one of its name was deleted must not
reuse a version whose occurrences were materialized and then cancelled."""

from __future__ import annotations

from dispatcher.queue.ids import occurrence_job_id
from dispatcher.store import ScheduleRow, Store, open_store

RETIRED = "0005_retired_schedule_versions.sql"


def _spec(name: str) -> ScheduleRow:
    return ScheduleRow(
        name=name, cron="* * * * * *", timezone="UTC", type="noop.v", shard=0, payload=b"", priority=1,
        max_attempts=3, lease_ttl_ms=60_000, max_lag_ms=60_000, catch_up="latest", enabled=True,
    )  # fmt: skip


async def _delete_and_clean_up(store: Store, name: str) -> int:
    """Delete the schedule and do what its owner's next tick does once the occurrences are cancelled."""
    assert await store.delete_schedule(name)
    [deleted] = await store.schedules_to_clean([0])
    await store.finish_cleanup(deleted, deleted.changed_at, None)
    assert await store.get_schedule(name) is None
    return deleted.version


async def test_a_schedule_created_again_after_its_deletion_continues_its_versions(db_url: str) -> None:
    store = await open_store(db_url)
    try:
        await store.migrate()
        first, created, _ = await store.upsert_schedule(_spec("again"), None)
        assert created and first.version == 1
        paused = await store.set_schedule_enabled("again", False)
        assert paused is not None and paused.version == 2
        [to_clean] = await store.schedules_to_clean([0])
        await store.finish_cleanup(to_clean, to_clean.changed_at, None)
        retired = await _delete_and_clean_up(store, "again")
        async with store.transaction() as tx:
            assert not await tx.execute("SELECT name FROM schedules WHERE name = 'again'")

        second, created, _ = await store.upsert_schedule(_spec("again"), None)
        assert created and second.version == retired + 1
        third, created, _ = await store.upsert_schedule(_spec("again"), None)
        assert not created and third.version == second.version  # unchanged: no new version
        retired_again = await _delete_and_clean_up(store, "again")
        assert retired_again > second.version  # a deletion is a version of its own
        fourth, created, _ = await store.upsert_schedule(_spec("again"), None)
        assert created and fourth.version == retired_again + 1

        # Another name starts at 1 whatever this one did.
        other, _, _ = await store.upsert_schedule(_spec("other"), None)
        assert other.version == 1
    finally:
        await store.close()


async def test_upgrading_keeps_the_versions_of_names_deleted_before(db_url: str) -> None:
    """A database from before the upgrade: a schedule of version 3 was deleted, its row is gone and
    its jobs remain. Created again after the upgrade, it starts at version 4."""
    store = await open_store(db_url)
    try:
        await store.migrate()
        # Back to the schema before the upgrade, holding the deleted schedule's jobs.
        async with store.transaction() as tx:
            await tx.execute("DROP TABLE retired_schedule_versions")
            await tx.execute("DELETE FROM schema_migrations WHERE version = ?", (RETIRED,))
            for version, at in ((1, 1_000), (3, 5_000), (2, 3_000)):
                await tx.execute(
                    "INSERT INTO jobs (id, type, shard, priority, payload, status, run_at, max_attempts, "
                    "lease_ttl_ms, enqueued_at, updated_at, schedule, schedule_version) "
                    "VALUES (?, 'noop.v', 0, 1, ?, 'cancelled', ?, 3, 60000, 0, 0, 'old', ?)",
                    (occurrence_job_id("old", version, at), b"", at, version),
                )
        assert await store.migrate() == [RETIRED]
        again, created, _ = await store.upsert_schedule(_spec("old"), None)
        assert created and again.version == 4
    finally:
        await store.close()
