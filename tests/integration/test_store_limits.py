"""The store on real SQLite and PostgreSQL: the dead-letter counts kept with every transition (and
seeded by the migration from the rows already dead), and idempotency keys scoped by job type (the
keys stored before the migration keep deduplicating within their type)."""

from __future__ import annotations

from importlib import resources

from dispatcher.store import JobRow, Store, StoreUpdate, open_store
from dispatcher.store.base import DeadFilter, _migration_for, _statements

SCOPED = "0006"  # the migrations that scope idempotency keys and count dead letters


def _row(job_id: str, job_type: str, status: str, priority: int = 1, key: str | None = None) -> JobRow:
    return JobRow(
        job_id, job_type, 0, priority, b"{}", status, 1, None, 0, 0, 0, 5, 60_000, key,
        None, None, None, 1, None, None, 1,
    )  # fmt: skip


async def _migrate_before(store: Store, version: str) -> None:
    """Apply the migrations older than ``version`` only: the schema of a database made before it."""
    root = resources.files("dispatcher.store") / "migrations"
    names = sorted(p.name for p in root.iterdir() if _migration_for(p.name, store.backend))
    async with store.transaction() as tx:
        await tx.execute(
            "CREATE TABLE schema_migrations (version TEXT PRIMARY KEY, applied_at BIGINT NOT NULL)"
        )
        for name in names:
            if name < version:
                for statement in _statements((root / name).read_text()):
                    await tx.execute(statement)
                await tx.execute("INSERT INTO schema_migrations VALUES (?, 0)", (name,))


async def _insert(store: Store, rows: list[JobRow]) -> None:
    async with store.transaction() as tx:
        for r in rows:
            await tx.execute(
                "INSERT INTO jobs (id, type, shard, priority, payload, status, run_at, max_attempts, "
                "lease_ttl_ms, idem_key, enqueued_at, updated_at) "
                "VALUES (?, ?, 0, ?, ?, ?, 1, 5, 60000, ?, 1, 1)",
                (r.id, r.type, r.priority, r.payload, r.status, r.idem_key),
            )


async def test_the_migration_counts_existing_dead_letters_and_keeps_old_keys(db_url: str) -> None:
    store = await open_store(db_url)
    try:
        await _migrate_before(store, SCOPED)
        await _insert(
            store,
            [
                *(_row(f"dead-a{i}", "a", "dead", 1) for i in range(3)),
                *(_row(f"dead-b{i}", "b", "dead", 0) for i in range(2)),
                _row("keyed", "a", "ready", key="order-1"),
                _row("done", "a", "succeeded"),
            ],
        )
        applied = await store.migrate()
        assert applied and all(name[:4] >= SCOPED for name in applied), applied  # and the later ones
        assert await store.dead_counts() == {("a", 1): 3, ("b", 0): 2}
        # The key stored before still finds its job within its type; another type may use it too.
        result = await store.insert_jobs(
            [_row("again", "a", "ready", key="order-1"), _row("b1", "b", "ready", key="order-1")]
        )
        assert result == [("keyed", False), ("b1", True)]
        assert (await store.get_job("keyed")).idem_key == "order-1"  # type: ignore[union-attr]
    finally:
        await store.close()


async def test_dead_counts_follow_updates_requeues_and_purges(db_url: str) -> None:
    store = await open_store(db_url)
    try:
        await store.migrate()
        await store.insert_jobs(
            [_row(f"j{i}", "t", "ready") for i in range(6)] + [_row("u0", "u", "ready", 2)]
        )
        dead = [StoreUpdate(f"j{i}", "dead", dead_reason="handler_error") for i in range(4)]
        await store.apply_updates([*dead, StoreUpdate("u0", "dead"), StoreUpdate("j5", "succeeded")])
        assert await store.dead_counts() == {("t", 1): 4, ("u", 2): 1}
        # A late update of a job already dead changes nothing (the row stays dead, counted once).
        await store.apply_updates([StoreUpdate("j0", "dead"), StoreUpdate("j1", "delayed")])
        assert await store.dead_counts() == {("t", 1): 4, ("u", 2): 1}
        await store.requeue_dead(["j0", "j1"], 5)
        assert await store.dead_counts() == {("t", 1): 2, ("u", 2): 1}
        assert await store.purge_dead(DeadFilter(type="t")) == 2
        assert await store.dead_counts() == {("u", 2): 1}
        assert await store.purge_dead(DeadFilter()) == 1
        assert await store.dead_counts() == {}
    finally:
        await store.close()
