"""The SQLite store on a real file: what a cancelled caller leaves behind does not break the next one."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from dispatcher.store.sqlite import SqliteStore
from tests.support.wait import wait_for


async def test_a_transaction_abandoned_by_a_cancelled_caller_is_undone(tmp_path: Path) -> None:
    """A caller cancelled while its BEGIN waits for the write lock leaves that BEGIN running in the
    connection's thread; once it gets the lock the connection sits in a transaction nobody owns. The
    next caller, even one that changes the durability setting (a PRAGMA SQLite refuses inside a
    transaction), must roll it back and commit its own."""
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
        with pytest.raises(asyncio.CancelledError):
            await waiting
        other.execute("COMMIT")  # the abandoned BEGIN takes the lock
        assert store._conn is not None
        await wait_for(lambda: store._conn is not None and store._conn.in_transaction, timeout=10)

        await write(2, durable=False)
        await write(3, durable=True)
        assert [r[0] for r in other.execute("SELECT x FROM t ORDER BY x")] == [2, 3]
    finally:
        other.close()
        await store.close()
