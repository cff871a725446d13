"""PostgresStore when the server behind its URL changes under the sessions it holds: a restart, and
a failover behind a DNS name, a virtual IP or a proxy that leaves the old primary up as a standby.

For the failover, one throwaway server plays both: a per-database setting keeps new sessions
writable (it outranks the configuration file), while the sessions already open follow the file on
reload and turn read-only, as if they had stayed on the old primary."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import psycopg
import pytest

from dispatcher.store.postgres import PostgresStore
from shardq_common.errors import StoreUnavailable
from tests.support.pg_cluster import PgCluster
from tests.support.wait import wait_for

from .test_store_jobs import _row  # a ready row of type "t" on shard 0, with the key if given


def open_sessions_turn_read_only(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("ALTER DATABASE postgres SET default_transaction_read_only = off")
        admin.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        admin.execute("SELECT pg_reload_conf()")


def the_server_turns_read_only(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        admin.execute("SELECT pg_reload_conf()")


def rows_in(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT COUNT(*) FROM jobs").fetchone()
        return int(row[0]) if row else 0


@pytest.fixture
async def store(pg_cluster: PgCluster) -> AsyncIterator[PostgresStore]:
    store = PostgresStore(pg_cluster.url, min_size=2, max_size=2)
    await store.open()
    await store.migrate()
    yield store
    await store.close()


async def test_single_inserts_go_on_through_a_new_session_without_an_error(
    pg_cluster: PgCluster, store: PostgresStore
) -> None:
    """A one-row insert (the single enqueue's, on the connection kept for them) refused as read-only
    is sent again on a new session: the producer never sees the failover."""
    await store.insert_jobs([_row()])
    assert store._kept is not None
    first_session = store._kept.info.backend_pid
    open_sessions_turn_read_only(pg_cluster.url)
    inserted = 1

    async def inserted_through_a_new_session() -> bool:
        nonlocal inserted
        await store.insert_jobs([_row()])  # raised ReadOnlySqlTransaction, and every one after it
        inserted += 1
        return store._kept is not None and store._kept.info.backend_pid != first_session

    await wait_for(
        inserted_through_a_new_session, timeout=10, message="the kept session never turned read-only"
    )
    assert rows_in(pg_cluster.url) == inserted


async def test_a_pooled_write_refused_as_read_only_is_unavailable_once_and_the_pool_connects_again(
    pg_cluster: PgCluster, store: PostgresStore
) -> None:
    """A transaction on a pooled session (a keyed insert) cannot be sent again: it fails, as an
    outage the caller may retry (UNAVAILABLE), and every pooled session connects again, so the next
    writes, on either of the pool's two sessions, go through."""
    keys = (f"key-{n}" for n in itertools.count())
    await store.insert_jobs([_row(next(keys))])
    open_sessions_turn_read_only(pg_cluster.url)
    refused: list[str] = []

    async def refused_once() -> bool:
        try:
            await store.insert_jobs([_row(next(keys))])
        except StoreUnavailable as exc:
            refused.append(str(exc))
        return bool(refused)

    await wait_for(refused_once, timeout=10, message="no pooled session turned read-only")
    assert "refuses writes" in refused[0]
    before = rows_in(pg_cluster.url)
    for _ in range(4):  # the pool hands its sessions out in turn: both are new ones
        await store.insert_jobs([_row(next(keys))])
    assert rows_in(pg_cluster.url) == before + 4


async def test_a_server_read_only_itself_refuses_every_write_without_reconnecting_at_each(
    pg_cluster: PgCluster, store: PostgresStore
) -> None:
    """Sessions opened since the last reconnect refuse writes too: the server is read-only itself (a
    disk-full guard, maintenance). Every write fails as an outage; the sessions connect again once,
    not at every write (at every one, 20 writes made about 80 sessions)."""
    keys = (f"key-{n}" for n in itertools.count())
    await store.insert_jobs([_row()])
    opened = store.pool.get_stats().get("connections_num", 0)
    the_server_turns_read_only(pg_cluster.url)
    failed = 0
    for n in range(20):
        try:
            await store.insert_jobs([_row(next(keys) if n % 2 else None)])  # pooled and kept in turn
        except StoreUnavailable as exc:
            assert "refuses writes" in str(exc)
            failed += 1
    assert failed >= 17  # each session (the pool's two, the kept one) may take one in before the reload
    assert store.pool.get_stats().get("connections_num", 0) - opened <= 2  # one drain of the pool's two
    assert rows_in(pg_cluster.url) == 1 + 20 - failed


async def test_after_a_restart_one_pooled_write_fails_and_the_pools_other_dead_sessions_are_replaced(
    pg_cluster: PgCluster, store: PostgresStore
) -> None:
    """Every pooled session died with the server. The first write meets a dead one and fails as an
    outage; the pool's other sessions are checked then, so no later write meets another."""
    keys = (f"key-{n}" for n in itertools.count())
    await store.insert_jobs([_row(next(keys))])
    pg_cluster.restart()
    with pytest.raises(StoreUnavailable):
        await store.insert_jobs([_row(next(keys))])
    for _ in range(4):  # the pool hands its sessions out in turn: the other one was dead too
        await store.insert_jobs([_row(next(keys))])
    assert rows_in(pg_cluster.url) == 5
