"""The job table on both stores: each backend runs its own migrations, and idempotency keys keep
deduplicating with the partial indexes (jobs without a key or a schedule are not indexed by them)."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import replace

from dispatcher.store import JobRow, open_store
from dispatcher.store.base import _migration_for

_ids = itertools.count()


def _row(key: str | None = None) -> JobRow:
    return JobRow(
        id=f"job-{next(_ids):06d}", type="t", shard=0, priority=1, payload=b"{}", status="ready",
        run_at=1, lease_until=None, attempts=0, failures=0, expirations=0, max_attempts=5,
        lease_ttl_ms=60_000, idem_key=key, last_error=None, dead_reason=None, result=None,
        enqueued_at=1, started_at=None, finished_at=None, updated_at=1,
    )  # fmt: skip


def test_a_migration_named_for_a_backend_runs_only_there() -> None:
    assert _migration_for("0001_initial.sql", "sqlite")
    assert _migration_for("0004_x.postgres.sql", "postgres")
    assert not _migration_for("0004_x.postgres.sql", "sqlite")
    assert not _migration_for("README.md", "postgres")


async def test_each_backend_applies_the_migrations_meant_for_it(db_url: str) -> None:
    store = await open_store(db_url)
    try:
        applied = await store.migrate()
    finally:
        await store.close()
    assert {"0001_initial.sql", "0003_partial_schedule_index.sql"} <= set(applied)
    postgres_only = "0004_partial_idem_key_index.postgres.sql"
    assert (postgres_only in applied) == (store.backend == "postgres")


async def test_idempotency_keys_dedupe_within_a_batch_across_batches_and_between_processes(
    db_url: str,
) -> None:
    store, other = await open_store(db_url), await open_store(db_url)
    try:
        await store.migrate()
        # Many rows without a key (the bulk path) beside keyed ones, a key twice in one batch.
        first = [_row("order-1"), *(_row() for _ in range(300)), _row("order-1"), _row("order-2")]
        results = await store.insert_jobs(first)
        assert results[0] == (first[0].id, True)
        assert results[-2] == (first[0].id, False)
        assert results[-1] == (first[-1].id, True)
        assert all(created for _, created in results[1:-2])

        again = [_row("order-2"), _row()]
        assert await store.insert_jobs(again) == [(first[-1].id, False), (again[1].id, True)]

        # Two processes enqueue the same new key at once: one job, both told its id.
        racing = [_row("order-3"), _row("order-3")]
        (a,), (b,) = await asyncio.gather(store.insert_jobs(racing[:1]), other.insert_jobs(racing[1:]))
        assert a[0] == b[0] and sorted([a[1], b[1]]) == [False, True]

        async with store.transaction() as tx:
            keyed = await tx.execute("SELECT COUNT(*) FROM jobs WHERE idem_key IS NOT NULL")
            total = await tx.execute("SELECT COUNT(*) FROM jobs")
        assert keyed[0][0] == 3 and total[0][0] == 3 + 300 + 1
    finally:
        await store.close()
        await other.close()


async def test_every_size_of_insert_keeps_every_column(db_url: str) -> None:
    """A few rows go as VALUES, a few hundred as one unnest() INSERT, more through COPY (PostgreSQL):
    each path stores every column of a new job as given."""
    store = await open_store(db_url)
    try:
        await store.migrate()
        for size in (1, 2, 8, 9, 200, 201):
            rows = [
                replace(
                    _row(),
                    type=f"t{i % 3}", shard=i % 7, priority=i % 3, payload=bytes([i % 256]) * (i + 1),
                    status="delayed" if i % 2 else "ready", run_at=10**12 + i, max_attempts=1 + i % 4,
                    lease_ttl_ms=1_000 + i, enqueued_at=10**12 - i, updated_at=10**12 - i,
                    concurrency_key=f"tenant-{i}" if i % 2 else None,
                    headers='{"traceparent": "x"}' if i % 3 == 0 else None,
                )
                for i in range(size)
            ]  # fmt: skip
            assert await store.insert_jobs(rows) == [(r.id, True) for r in rows]
            stored = {r.id: r for r in await store.get_jobs([r.id for r in rows])}
            assert [stored[r.id] for r in rows] == rows, size
    finally:
        await store.close()
