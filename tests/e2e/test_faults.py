"""Dependencies failing under a running dispatcher: the DB (PostgreSQL refusing connections) and Redis
(SIGKILLed, then back empty). Enqueues either fail cleanly with nothing half-written, or are accepted
into the DB and run exactly once when the dependency returns."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import psycopg
import pytest
import redis
from psycopg import sql

from tests.support.processes import read_ledger
from tests.support.wait import wait_until
from worker_sdk import Client, UnavailableError


def count_jobs(db_url: str, job_type: str | None = None) -> int:
    """Rows in the jobs table (of one type), read straight from the database."""
    query, params = "SELECT COUNT(*) FROM jobs", ()
    if job_type is not None:
        query, params = query + " WHERE type = ?", (job_type,)
    if db_url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(db_url.removeprefix("sqlite:///"))) as conn:
            return int(conn.execute(query, params).fetchone()[0])
    with psycopg.connect(db_url, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(query.replace("?", "%s"), params).fetchone()
        assert row is not None
        return int(row[0])


def job_keys_in_redis(redis_url: str) -> dict[str, int]:
    """Per shard jobs/payloads hash, its number of entries (only the non-empty ones)."""
    with redis.Redis.from_url(redis_url) as r:
        out = {}
        for pattern in ("shardq:*:jobs", "shardq:*:payloads"):
            for key in r.scan_iter(match=pattern):
                n = int(r.hlen(key))
                if n:
                    out[key.decode()] = n
        return out


def db_status(db_url: str, job_id: str) -> str | None:
    """The job's status column, read straight from the database."""
    if db_url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(db_url.removeprefix("sqlite:///"))) as conn:
            row = conn.execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone()
    else:
        with psycopg.connect(db_url, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute("SELECT status FROM jobs WHERE id = %s", (job_id,)).fetchone()
    return None if row is None else str(row[0])


def starts_of(ledger, job_id: str) -> list[dict]:
    return [e for e in read_ledger(ledger) if e["event"] == "start" and e["job"] == job_id]


@contextlib.contextmanager
def database_refusing_connections(admin_url: str, name: str) -> Iterator[None]:
    """Database ``name`` refuses new connections and its open ones are terminated; restored after."""
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(sql.Identifier(name)))
        try:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            yield
        finally:
            conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(sql.Identifier(name)))


# PostgreSQL only: a SQLite file cannot become unreachable like a server.
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_db_down_during_enqueue(dispatcher, db_url, pg_admin_url, redis_url, start_worker, ledger):
    name = urlsplit(db_url).path.lstrip("/")
    with Client(dispatcher.target, timeout=20) as client:
        assert client.stats() == [] and job_keys_in_redis(redis_url) == {}
        with database_refusing_connections(pg_admin_url, name):
            for attempt in range(2):  # a terminated pooled connection, then an empty pool that cannot grow
                started = time.monotonic()
                with pytest.raises(UnavailableError) as info:
                    client.enqueue("noop_down", {"attempt": attempt})
                assert time.monotonic() - started < 15, f"UNAVAILABLE took {time.monotonic() - started:.1f} s"
                assert "database" in info.value.details.lower(), info.value.details
            with pytest.raises(UnavailableError):
                client.enqueue_many([{"type": "noop_down", "payload": {"i": i}} for i in range(50)])
            assert job_keys_in_redis(redis_url) == {}, "a refused enqueue left a job in Redis"
            assert dispatcher.ready(), "the dispatcher stopped serving while the DB was down"
        assert count_jobs(db_url, "noop_down") == 0, "a refused enqueue left a row in the DB"

        # The DB is back: enqueue works again once the pool reconnects. The idempotency key keeps a
        # retried attempt (say one that timed out client-side but committed) from making a second job.
        def enqueue_after() -> str | None:
            try:
                return client.enqueue("noop", {"after": "outage"}, idempotency_key="after-db-outage")
            except UnavailableError:
                return None

        job_id = wait_until(
            enqueue_after,
            timeout=40,
            interval=0.5,
            message="no enqueue succeeded within 40 s of the DB coming back",
        )
        assert count_jobs(db_url) == 1  # this one, nothing from the outage
        start_worker(dispatcher.target, types="noop", concurrency=4)
        wait_until(lambda: client.get_job(job_id).status == "succeeded", timeout=30)
        # The status writer commits again.
        wait_until(lambda: db_status(db_url, job_id) == "succeeded", timeout=20)
        assert len(starts_of(ledger, job_id)) == 1
        assert {e["job"] for e in read_ledger(ledger)} == {job_id}


def test_redis_down_during_enqueue(start_dispatcher, private_redis, db_url, start_worker, ledger):
    types = ["noop", "noop_a", "noop_b", "noop_c", "noop_d"]  # several shards (8 of them here)
    proc = start_dispatcher(private_redis.url, db_url)
    with Client(proc.target, timeout=60) as client:
        private_redis.kill()
        started = time.monotonic()
        # Accepted into the DB; the reconciler pushes them to Redis when Redis is back.
        job_id = client.enqueue("noop", {"redis": "down"})
        batch = client.enqueue_many([{"type": types[i % 5], "payload": {"i": i}} for i in range(20)])
        took = time.monotonic() - started
        assert count_jobs(db_url) == 21
        assert proc.ready(), "the dispatcher stopped serving while Redis was down"
        private_redis.start()  # same port, no data
        start_worker(proc.target, types=",".join(types), concurrency=4)
        everything = [job_id, *batch]
        wait_until(
            lambda: all(client.get_job(i).status == "succeeded" for i in everything),
            timeout=45,
            interval=0.2,
            message=lambda: (
                f"jobs not run after Redis came back (the enqueues took {took:.1f} s): "
                f"{[i for i in everything if client.get_job(i).status != 'succeeded']}\n"
                f"{proc.log_tail()}"
            ),
        )
        marker = client.enqueue("noop", {"marker": True})  # same shard: runs after any duplicate would
        wait_until(lambda: client.get_job(marker).status == "succeeded", timeout=20)
        wait_until(lambda: all(db_status(db_url, i) == "succeeded" for i in everything), timeout=20)
        runs = {i: len(starts_of(ledger, i)) for i in everything}
        assert set(runs.values()) == {1}, runs
        job = client.get_job(job_id)
        assert job.attempts == 1 and job.failures == 0 and job.expirations == 0
    assert proc.process is not None and proc.process.poll() is None
