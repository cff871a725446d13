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
