"""The SQLite store on a real file: what a cancelled caller leaves behind does not break the next one."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from dispatcher.store.sqlite import SqliteStore


async def test_a_transaction_abandoned_by_a_cancelled_caller_is_undone(tmp_path: Path) -> None:
    """A caller cancelled while its BEGIN waits for the write lock leaves that BEGIN running in the
    connection's thread. It must not end as a transaction nobody owns (it would hold the lock for
    every process until this one wrote again), and the next caller, even one that changes the
    durability setting (a PRAGMA SQLite refuses inside a transaction), must commit its own."""
    store = SqliteStore(str(tmp_path / "store.sqlite3"))
    await store.open()
    other = sqlite3.connect(tmp_path / "store.sqlite3", isolation_level=None)
    try:
        other.execute("CREATE TABLE t (x INTEGER)")
        other.execute("BEGIN IMMEDIATE")  # holds the write lock

        async def write(value: int, durable: bool) -> None:
            async with store.transaction(durable=durable) as tx:
                await tx.execute("INSERT INTO t VALUES (?)", (value,))

        waiting = asyncio.create_task(write(1, durable=True))
        await asyncio.sleep(0.3)  # its BEGIN IMMEDIATE is now waiting on the lock in the thread
        waiting.cancel()
        other.execute("COMMIT")  # the cancelled caller's BEGIN gets the lock
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert store._conn is not None
        other.execute("BEGIN IMMEDIATE")  # the lock is free: nothing was left holding it
        other.execute("COMMIT")

        await write(2, durable=False)
        await write(3, durable=True)
        assert [r[0] for r in other.execute("SELECT x FROM t ORDER BY x")] == [2, 3]
    finally:
        other.close()
        await store.close()


async def test_a_new_file_gives_the_pages_retention_freed_back_a_bounded_number_at_a_time(
    tmp_path: Path,
) -> None:
    """A file made by this version has auto_vacuum=INCREMENTAL; once over a tenth of it is free,
    each call gives up to VACUUM_PAGES pages back, and the file shrinks. A file made before keeps
    its mode: nothing is vacuumed behind the operator's back."""
    from dispatcher.store.sqlite import VACUUM_PAGES

    path = tmp_path / "store.sqlite3"
    store = SqliteStore(str(path))
    await store.open()
    try:
        await store.migrate()
        async with store.transaction() as tx:
            await tx.execute(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) "
                "INSERT INTO jobs (id, type, shard, priority, payload, status, run_at, max_attempts, "
                "lease_ttl_ms, enqueued_at, updated_at) "
                "SELECT printf('%026d', i), 't', 0, 1, zeroblob(500), 'succeeded', 1, 5, 1000, 1, 1 FROM n"
            )
        assert await store.vacuum_some() == 0  # nothing free yet
        async with store.transaction() as tx:
            await tx.execute("DELETE FROM jobs")
        size = (await store.table_bytes())["file"]
        freed = await store.vacuum_some()
        assert 0 < freed <= VACUUM_PAGES
        while await store.vacuum_some():
            pass
        assert (await store.table_bytes())["file"] < size / 4
    finally:
        await store.close()

    old = tmp_path / "old.sqlite3"
    sqlite3.connect(old).execute("CREATE TABLE t (x)").connection.close()  # made without the mode
    store = SqliteStore(str(old))
    await store.open()
    try:
        assert await store._pragma("auto_vacuum") == 0
        assert await store.vacuum_some() == 0
    finally:
        await store.close()
