"""Dependencies failing under a running dispatcher: the DB (PostgreSQL refusing connections, or a
throwaway PostgreSQL server stopped outright) and Redis (SIGKILLed, then back empty). Enqueues either
fail cleanly with nothing half-written, or are accepted into the DB and run exactly once when the
dependency returns; jobs already queued keep running from Redis while the DB is down."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import psycopg
import pytest
import redis
from psycopg import sql

from dispatcher.queue.ingest import MAX_UNQUEUED
from dispatcher.queue.keys import ShardKeys
from dispatcher.queue.records import JobRecord
from tests.support.processes import read_ledger
from tests.support.snapshots import count_jobs, db_status, job_keys_in_redis
from tests.support.wait import wait_until
from worker_sdk import Client, UnavailableError


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


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_stalled_redis_holds_enqueue_answers_once_the_committed_backlog_passes_its_bound(
    start_dispatcher, private_redis, db_url
):
    """An enqueue is answered at its commit and queued in Redis behind the answer. While Redis does
    not answer (SIGSTOP: its socket stays open, so the pushes wait rather than fail), answers go on
    until MAX_UNQUEUED committed jobs wait for their push; later enqueues still commit, but their
    answers wait until Redis drains the backlog. So a producer faster than Redis is held to its pace."""
    calls, per_call = MAX_UNQUEUED // 1000 + 5, 1000
    answered_while_stalled = MAX_UNQUEUED // per_call
    # A long ownership lease: the pause must not cost this process its shards.
    proc = start_dispatcher(private_redis.url, db_url, ownership_ttl_ms=60_000)
    with Client(proc.target, timeout=60) as client, ThreadPoolExecutor(calls) as pool:
        client.enqueue("noop", {"warm": True})
        wait_until(lambda: sum(s.ready for s in client.stats()) == 1, timeout=10)  # its push landed
        assert private_redis.pid is not None
        os.kill(private_redis.pid, signal.SIGSTOP)
        try:
            answers = [
                pool.submit(client.enqueue_many, [{"type": f"noop{i % 5}", "payload": {"i": i}}] * per_call)
                for i in range(calls)
            ]
            # Every call commits; only the first answers leave while their pushes cannot land.
            wait_until(lambda: count_jobs(db_url) == 1 + calls * per_call, timeout=30)
            with pytest.raises(AssertionError):
                wait_until(lambda: sum(a.done() for a in answers) > answered_while_stalled, timeout=2)
            assert sum(a.done() for a in answers) == answered_while_stalled
        finally:
            os.kill(private_redis.pid, signal.SIGCONT)
        for answer in answers:
            assert len(answer.result(timeout=30)) == per_call
        total = 1 + calls * per_call
        wait_until(
            lambda: sum(s.ready for s in client.stats()) == total,
            timeout=30,
            message=lambda: f"{sum(s.ready for s in client.stats())} of {total} ready in Redis",
        )


def redis_states(redis_url: str, shard_count: int, ids: list[str]) -> dict[str, str]:
    """Job id -> its state in Redis (the working set), for the ids Redis holds a record of."""
    out = {}
    with redis.Redis.from_url(redis_url) as r:
        for shard in range(shard_count):
            for job_id, raw in zip(ids, r.hmget(ShardKeys(shard).jobs, ids), strict=True):
                if raw:
                    out[job_id] = str(JobRecord.unpack(raw).state)
    return out


def test_db_down_while_jobs_run(pg_cluster, start_dispatcher, redis_url, start_worker, ledger):
    """The PostgreSQL server crashes (immediate shutdown: commits not yet on disk are lost, as in a
    real crash; status commits do not wait for the disk) with jobs queued and running: they keep
    being leased, retried, promoted and acked from Redis; enqueue answers UNAVAILABLE; when the
    server is back, every job's row catches up and Redis lets go of the finished records."""
    proc = start_dispatcher(redis_url, pg_cluster.url)
    with Client(proc.target, timeout=20) as client:
        ids = client.enqueue_many(
            [{"type": "sleep_dbdown", "payload": {"sleep": 0.3}} for _ in range(30)]
            + [{"type": "flaky_dbdown", "payload": {"fail_times": 1}} for _ in range(5)]  # a retry each
            + [{"type": "noop_dbdown", "delay": 3} for _ in range(5)]  # promoted during the outage
        )
        start_worker(proc.target, types="sleep_dbdown,flaky_dbdown,noop_dbdown", concurrency=4)
        wait_until(lambda: any(e["event"] == "start" for e in read_ledger(ledger)), timeout=15)
        pg_cluster.stop("immediate")
        outage = time.monotonic()

        def ended() -> set[str]:
            return {e["job"] for e in read_ledger(ledger) if e["event"] == "end"}

        wait_until(
            lambda: ended() >= set(ids),
            timeout=40,
            interval=0.2,
            message=lambda: (
                f"{len(set(ids) - ended())} jobs did not run while the DB was down:\n{proc.log_tail(10)}"
            ),
        )
        ran_within = time.monotonic() - outage
        states = redis_states(redis_url, 8, ids)
        assert set(states.values()) == {"succeeded"} and len(states) == len(ids), states
        with pytest.raises(UnavailableError):
            client.enqueue("noop_dbdown", {"during": "outage"})
        assert proc.ready(), "the dispatcher stopped answering while the DB was down"
        pg_cluster.start()

        wait_until(
            lambda: all(db_status(pg_cluster.url, i) == "succeeded" for i in ids),
            timeout=40,
            interval=0.5,
            message=lambda: f"status did not catch up:\n{proc.log_tail(10)}",
        )
        wait_until(
            lambda: job_keys_in_redis(redis_url) == {},
            timeout=20,
            message=lambda: f"finished records left in Redis: {job_keys_in_redis(redis_url)}",
        )
        runs = [e["job"] for e in read_ledger(ledger) if e["event"] == "start"]
        flaky = set(ids[30:35])
        assert {i: runs.count(i) for i in ids} == {i: 2 if i in flaky else 1 for i in ids}
        job = client.get_job(ids[30])
        assert (job.status, job.attempts, job.failures) == ("succeeded", 2, 1)
        assert count_jobs(pg_cluster.url) == len(ids)  # nothing from the refused enqueue
        print(f"{len(ids)} jobs ran {ran_within:.1f} s into the DB outage")


def test_redis_down_while_jobs_run(start_dispatcher, private_redis, db_url, start_worker, ledger):
    """Redis dies (SIGKILL) with jobs queued and running, and comes back empty: the DB restores every
    job that had not finished (those in flight run again: at-least-once), and none is lost."""
    proc = start_dispatcher(private_redis.url, db_url)
    with Client(proc.target, timeout=60) as client:
        ids = client.enqueue_many([{"type": "sleep_redisdown", "payload": {"sleep": 0.3}} for _ in range(40)])
        start_worker(proc.target, types="sleep_redisdown", concurrency=4)
        wait_until(lambda: sum(e["event"] == "end" for e in read_ledger(ledger)) >= 5, timeout=20)
        private_redis.kill()
        time.sleep(1.0)  # an outage, not a blip: the worker's acks and the loops meet a dead Redis
        assert proc.ready(), "the dispatcher stopped answering while Redis was down"
        private_redis.start()  # same port, no data

        def unfinished() -> list[str]:
            return [i for i in ids if db_status(db_url, i) != "succeeded"]

        wait_until(
            lambda: not unfinished(),
            timeout=60,
            interval=0.5,
            message=lambda: (
                f"{len(unfinished())} jobs never finished after Redis came back:\n{proc.log_tail(15)}"
            ),
        )
        ended = {e["job"] for e in read_ledger(ledger) if e["event"] == "end"}
        assert ended == set(ids)
        assert {client.get_job(i).status for i in ids} == {"succeeded"}
        assert count_jobs(db_url) == len(ids)


def test_the_first_enqueue_after_the_database_restarts_is_accepted(pg_cluster, start_dispatcher, redis_url):
    """PostgreSQL restarts while the dispatcher idles: the connections it holds are dead, and it only
    finds out when it next uses one. A single enqueue then (the one-statement insert, on a connection
    that may have died since its last use) is accepted, not refused: the statement is sent once more,
    on a connection that works, which is safe since it inserts new ids and skips ids present."""
    proc = start_dispatcher(redis_url, pg_cluster.url)
    with Client(proc.target, timeout=20) as client:
        before = [client.enqueue("noop_pgrestart", {"i": i}) for i in range(3)]
        pg_cluster.restart("fast")
        after = [client.enqueue("noop_pgrestart", {"i": i}) for i in range(3)]
        assert len(set(before + after)) == 6
        assert all(db_status(pg_cluster.url, i) in ("ready", "succeeded") for i in after)
