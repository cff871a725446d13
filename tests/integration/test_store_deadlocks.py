"""A transaction that loses a deadlock runs again (PostgreSQL: when two transactions lock the same
rows in opposite orders, the one whose wait is checked first is aborted). The transactions that
resolve dependencies lock jobs along the graph: a cancel from the job it cancels, a status batch
from the jobs it finished, an enqueue from the dependencies it names, so a cancel's cascade and a
status batch releasing the same jobs, say, can meet that way. Here another connection takes the
rows in the opposite order; its own deadlock check is put off, so the store's transaction is the
one aborted, and it must commit on its next run instead of reporting the database unavailable."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from dispatcher.store import Store, StoreUpdate
from dispatcher.store.dependencies import Edge
from tests.support.db import graph_row
from tests.support.wait import wait_for

pytestmark = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)


async def _a_backend_waits_for_a_lock(monitor: psycopg.AsyncConnection[object]) -> bool:
    cur = await monitor.execute(
        "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    return await cur.fetchone() is not None


async def _lock_in_opposite_order(db_url: str, held: str, wanted: str, store_call: object) -> object:
    """Run ``store_call`` (a coroutine) while another transaction holds row ``held``; once the store
    waits for it, that transaction takes row ``wanted``, which the store holds by then: a deadlock.
    Returns what the store's call returned."""
    async with (
        await psycopg.AsyncConnection.connect(db_url, autocommit=True) as monitor,
        await psycopg.AsyncConnection.connect(db_url) as other,
    ):
        await other.execute("SET deadlock_timeout = '60s'")  # the store's backend checks first (1 s)
        await other.execute("UPDATE jobs SET updated_at = updated_at WHERE id = %s", (held,))
        call = asyncio.ensure_future(store_call)  # type: ignore[arg-type]
        await wait_for(lambda: _a_backend_waits_for_a_lock(monitor), timeout=10)
        take = asyncio.ensure_future(
            other.execute("UPDATE jobs SET updated_at = updated_at WHERE id = %s", (wanted,))
        )
        # The store's transaction is aborted after its 1 s check, which gives this one the row.
        await asyncio.wait_for(take, timeout=15)
        await other.commit()
        return await asyncio.wait_for(call, timeout=15)


async def test_a_cancel_that_loses_a_deadlock_runs_again(db_url: str, store: Store) -> None:
    # Cancelling q locks q, then cancels p (which waits for q under 'fail').
    await store.insert_graph([graph_row("q"), graph_row("p", 1)], [Edge("p", "q")], lambda t: True, str)
    outcome = await _lock_in_opposite_order(db_url, "p", "q", store.set_cancelled("q"))
    assert outcome == "cancelled"
    async with store.transaction() as tx:
        rows = await tx.execute("SELECT id, status FROM jobs ORDER BY id")
    assert rows == [("p", "cancelled"), ("q", "cancelled")]


async def test_a_status_batch_that_loses_a_deadlock_runs_again(db_url: str, store: Store) -> None:
    released: list[str] = []
    store.on_resolved = lambda promoted, cancelled: released.extend(r.id for r in promoted)
    # Recording x's end locks x, then releases w (which waits for x).
    await store.insert_graph([graph_row("x"), graph_row("w", 1)], [Edge("w", "x")], lambda t: True, str)
    batch = store.apply_updates([StoreUpdate("x", "succeeded", finished_at=1, result=b"r")])
    await _lock_in_opposite_order(db_url, "w", "x", batch)
    assert released == ["w"]
    async with store.transaction() as tx:
        rows = await tx.execute("SELECT id, status FROM jobs ORDER BY id")
    assert rows == [("w", "ready"), ("x", "succeeded")]


async def test_an_enqueue_naming_dependencies_that_loses_a_deadlock_runs_again(
    db_url: str, store: Store
) -> None:
    # An enqueue that names d1 and d2 locks them in id order: d1, then d2.
    await store.insert_jobs([graph_row("d1"), graph_row("d2")])
    enqueue = store.insert_graph([graph_row("n", 2)], [Edge("n", "d1"), Edge("n", "d2")], lambda t: True, str)
    results, _ = await _lock_in_opposite_order(db_url, "d2", "d1", enqueue)  # type: ignore[misc]
    assert results == [("n", True)]
    async with store.transaction() as tx:
        rows = await tx.execute("SELECT job_id, depends_on_id FROM job_dependencies ORDER BY 2")
    assert rows == [("n", "d1"), ("n", "d2")]
