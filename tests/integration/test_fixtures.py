"""The shared fixtures work: real Redis servers, both database backends, uvloop, the wait helpers."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis
import redis.asyncio
import uvloop

from dispatcher.store import open_store
from tests.support.ports import free_port
from tests.support.redis_server import RedisServer
from tests.support.wait import wait_for, wait_until


def test_redis_url_answers_ping(redis_url: str) -> None:
    assert redis_url.startswith("redis://127.0.0.1:") and redis_url.endswith("/0")
    with redis.Redis.from_url(redis_url) as client:
        assert client.ping() is True
        assert client.dbsize() == 0  # flushed before the test
        client.set("shardq:test", "left behind")  # the next user of redis_url must not see it


async def test_redis_url_async_client(redis_url: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        assert await client.ping() is True
        assert await client.dbsize() == 0
        assert await client.eval("return redis.call('INCR', KEYS[1])", 1, "shardq:n") == 1
    finally:
        await client.aclose()


async def test_event_loop_is_uvloop() -> None:
    assert isinstance(asyncio.get_running_loop(), uvloop.Loop)


def test_private_redis_restart_loses_data(private_redis: RedisServer, redis_server: RedisServer) -> None:
    assert private_redis.port != redis_server.port
    port = private_redis.port
    with private_redis.client() as client:
        client.set("k", "v")
        assert client.get("k") == b"v"
    private_redis.restart()
    assert private_redis.port == port and private_redis.is_running()
    with private_redis.client() as client:
        assert client.get("k") is None
        assert client.dbsize() == 0


def test_private_redis_kill_and_start(private_redis: RedisServer) -> None:
    private_redis.kill()
    assert not private_redis.is_running()
    with private_redis.client(socket_connect_timeout=0.5) as client, pytest.raises(redis.ConnectionError):
        client.ping()
    private_redis.start()
    with private_redis.client() as client:
        assert client.ping() is True


def test_redis_server_reports_exit_at_start(tmp_path: Path, redis_server: RedisServer) -> None:
    clash = RedisServer(tmp_path, port=redis_server.port)  # the port is taken
    with pytest.raises(RuntimeError, match="exited at start"):
        clash.start()
    assert not clash.is_running()


async def test_db_url_store_migrates_and_pings(db_url: str) -> None:
    store = await open_store(db_url)
    try:
        applied = await store.migrate()
        assert "0001_initial.sql" in applied  # a fresh database
        await store.ping()
        assert await store.migrate() == []  # idempotent
    finally:
        await store.close()


async def test_wait_for_sync_and_async_predicates() -> None:
    started = time.monotonic()
    assert await wait_for(lambda: time.monotonic() - started > 0.02, timeout=5) is True

    calls = 0

    async def third_time() -> int:
        nonlocal calls
        calls += 1
        return calls if calls >= 3 else 0

    assert await wait_for(third_time, timeout=5, interval=0.001) == 3
    with pytest.raises(AssertionError, match="never"):
        await wait_for(lambda: False, timeout=0.05, message="never")


def test_wait_until() -> None:
    values = iter([0, 0, "done"])
    assert wait_until(lambda: next(values), timeout=5, interval=0.001) == "done"
    with pytest.raises(AssertionError, match="still false"):
        wait_until(lambda: None, timeout=0.05, message=lambda: "still false")


def test_free_port_is_bindable() -> None:
    import socket

    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


async def test_processes_starting_together_apply_each_migration_once(db_url: str) -> None:
    stores = [await open_store(db_url) for _ in range(4)]
    try:
        applied = await asyncio.gather(*(store.migrate() for store in stores))
        names = [name for per_store in applied for name in per_store]
        assert "0001_initial.sql" in names
        assert len(names) == len(set(names))  # no migration twice, and no process failed
    finally:
        for store in stores:
            await store.close()
