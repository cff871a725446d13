"""Shared fixtures: real Redis servers, SQLite and PostgreSQL databases, uvloop for every async test.

Fixtures
--------
redis_server   (session)  one RedisServer for the whole run
redis_url      (function) that server's URL, FLUSHALLed before the test
private_redis  (function) a RedisServer of the test's own, for tests that kill or restart Redis
redis_cluster  (session)  one 3-master RedisCluster3 for the whole run (skips without redis-cli,
                          fails when CI is set)
redis_cluster_url (function) its ``redis+cluster://`` URL, every master FLUSHALLed before the test
pg_admin_url   (session)  SHARDQ_TEST_PG_URL, or the local default server, or None
db_url         (function) parametrized [sqlite] and [postgres]: a fresh, empty database URL
pg_cluster     (function) a PostgreSQL server of the test's own (PgCluster), to stop or reconfigure
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import uvloop

from tests.support import postgres
from tests.support.pg_cluster import PgCluster, find_pg_bin
from tests.support.redis_cluster import RedisCliNotFound, RedisCluster3
from tests.support.redis_server import RedisServer


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], Any]]:
    """Every async test and fixture runs on uvloop (pytest-asyncio >= 1.5 hook)."""
    return {"uvloop": uvloop.new_event_loop}


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


# -- Redis ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the session. Tests that stop or kill Redis use ``private_redis``."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """``redis://127.0.0.1:PORT/0`` of the session server, emptied (FLUSHALL) before the test."""
    if not redis_server.is_running():  # a test stopped the shared server: bring it back
        redis_server.start()
    with redis_server.client() as client:
        client.flushall()
    return redis_server.url


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A running RedisServer of this test's own (``.kill()``, ``.restart()`` freely); stopped after."""
    server = RedisServer(tmp_path / "private-redis")
    server.start()
    yield server
    server.stop()


# -- Redis Cluster -------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster3]:
    """One 3-master Redis Cluster for the session. Without redis-cli: skip, or fail when CI is set."""
    try:
        cluster = RedisCluster3(tmp_path_factory.mktemp("redis-cluster"))
    except RedisCliNotFound as exc:
        if _in_ci():
            pytest.fail(f"CI needs a Redis Cluster: {exc}", pytrace=False)
        pytest.skip(str(exc))
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def redis_cluster_url(redis_cluster: RedisCluster3) -> str:
    """``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`` of the session cluster, every
    master emptied (FLUSHALL) before the test. A node a test stopped is started again first."""
    if not redis_cluster.is_running():
        redis_cluster.ensure_running()
    redis_cluster.flushall()
    return redis_cluster.url


# -- Databases -----------------------------------------------------------------------


@functools.cache
def _pg_admin() -> tuple[str | None, str]:
    return postgres.admin_url()


@pytest.fixture(scope="session")
def pg_admin_url() -> str | None:
    """The admin database URL tests create their databases from, or None when there is no server."""
    return _pg_admin()[0]


@contextlib.contextmanager
def _fresh_database(request: pytest.FixtureRequest, folder: Path) -> Iterator[str]:
    """``sqlite:///<folder>/shardq.sqlite3``, or a new PostgreSQL database (dropped after). Without
    PostgreSQL the [postgres] case skips, or fails when CI is set."""
    if request.param == "sqlite":
        yield f"sqlite:///{folder}/shardq.sqlite3"
        return
    admin = request.getfixturevalue("pg_admin_url")
    if admin is None:
        why = _pg_admin()[1]
        if _in_ci():
            pytest.fail(f"CI needs PostgreSQL: {why}", pytrace=False)
        pytest.skip(why)
    with postgres.TempDatabase(admin) as url:
        yield url


@pytest.fixture
def pg_cluster() -> Iterator[PgCluster]:
    """A PostgreSQL server of this test's own, which it may stop or reconfigure (the shared server is
    never touched that way). Without the server binaries: skip, or fail when CI is set."""
    bin_dir = find_pg_bin()
    if bin_dir is None:
        if _in_ci():
            pytest.fail("CI needs the PostgreSQL server binaries for a throwaway cluster", pytrace=False)
        pytest.skip("no PostgreSQL server binaries (/usr/lib/postgresql/*/bin) for a throwaway cluster")
    cluster = PgCluster(bin_dir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database for the test (see _fresh_database)."""
    with _fresh_database(request, tmp_path) as url:
        yield url


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def module_db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh database shared by a module's tests (a module that starts one stack per backend)."""
    with _fresh_database(request, tmp_path_factory.mktemp("db")) as url:
        yield url
