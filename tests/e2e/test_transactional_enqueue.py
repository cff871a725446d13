"""Jobs enqueued inside a producer's own PostgreSQL transaction (shardq_enqueue_v1 through the SDK's
enqueue_in_transaction), run by real dispatcher and worker processes: a commit runs the job, a
rollback leaves no job and no trace in Redis, a dispatcher down at the commit runs it once it is
back, 10,000 jobs of one transaction all run, and with the LISTEN connection killed (and no new
connection possible) the sweep still finds the jobs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from dispatcher.queue.keys import ShardKeys
from shardmap import shard_for
from tests.support.db import query
from tests.support.processes import DispatcherProcess, WorkerProcess, events
from tests.support.wait import wait_until
from worker_sdk import enqueue_in_transaction, enqueue_many_in_transaction

SHARD_COUNT = 8  # tests/e2e/conftest.py TEST_SETTINGS

pytestmark = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)


def started(ledger: Path) -> set[str]:
    return {e["job"] for e in events(ledger, "start")}


def wait_started(ledger: Path, ids: set[str], timeout: float = 20.0) -> None:
    wait_until(
        lambda: ids <= started(ledger),
        timeout=timeout,
        interval=0.05,
        message=lambda: f"{len(ids - started(ledger))} of {len(ids)} jobs never started",
    )


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def test_a_committed_job_runs_and_a_rolled_back_one_leaves_no_job_and_no_trace(
    start_dispatcher: Callable[..., DispatcherProcess],
    start_worker: Callable[..., WorkerProcess],
    ledger: Path,
    redis_url: str,
    db_url: str,
    redis_client: redis.Redis,
) -> None:
    # A sweep too slow to matter here: the notification at the commit is what queues the job.
    dispatcher = start_dispatcher(redis_url, db_url, sql_enqueue_sweep_s=3600)
    start_worker(dispatcher.target, types="noop.txn")
    with psycopg.connect(db_url) as conn:
        # The application's own write and its job, in one transaction that rolls back...
        conn.execute("CREATE TABLE orders (id serial PRIMARY KEY, item text NOT NULL)")
        conn.commit()
        conn.execute("INSERT INTO orders (item) VALUES ('rolled back')")
        rolled_back = enqueue_in_transaction(conn, "noop.txn", {"order": "rolled back"})
        conn.rollback()
        # ...and one that commits.
        conn.execute("INSERT INTO orders (item) VALUES ('kept')")
        committed = enqueue_in_transaction(conn, "noop.txn", {"order": "kept"})
        conn.commit()
    wait_started(ledger, {committed})
    # Another job of the type's shard, committed after it and queued behind it (FIFO): once it has
    # run, the rolled-back one had every chance to.
    with psycopg.connect(db_url) as conn:
        sentinel = enqueue_in_transaction(conn, "noop.txn", {"order": "sentinel"})
        conn.commit()
    wait_started(ledger, {sentinel})
    assert rolled_back not in started(ledger)
    assert query(db_url, "SELECT id FROM jobs WHERE id = ?", (rolled_back,)) == []
    assert query(db_url, "SELECT id FROM jobs_to_push") == []  # every committed job was pushed
    keys = ShardKeys(shard_for("noop.txn", SHARD_COUNT))
    assert not redis_client.hexists(keys.jobs, rolled_back)
    assert not redis_client.hexists(keys.payloads, rolled_back)
    assert query(db_url, "SELECT item FROM orders") == [("kept",)]


def test_a_job_committed_while_no_dispatcher_runs_runs_when_one_is_back(
    start_dispatcher: Callable[..., DispatcherProcess],
    start_worker: Callable[..., WorkerProcess],
    ledger: Path,
    redis_url: str,
    db_url: str,
) -> None:
    dispatcher = start_dispatcher(redis_url, db_url, sql_enqueue_sweep_s=3600)
    dispatcher.kill()  # it applied the migrations and recorded the shard count: the functions work
    with psycopg.connect(db_url) as conn:
        ids = set(
            enqueue_many_in_transaction(conn, [{"type": f"noop.down{i}", "payload": {}} for i in range(8)])
        )
        conn.commit()
    # A long outage: the jobs are older than the time a push is given to land (reconciler.IN_FLIGHT_MS),
    # so the reconcile on acquisition finds them missing from Redis before the push does.
    query(db_url, "UPDATE jobs SET enqueued_at = enqueued_at - 60000, updated_at = updated_at - 60000")
    dispatcher.start()
    start_worker(dispatcher.target, types=",".join(f"noop.down{i}" for i in range(8)))
    wait_started(ledger, ids)
    # Pushed as committed jobs whose push was pending, not reported as lost from Redis.
    assert "restored jobs missing from Redis" not in dispatcher.log_tail(400)


def test_ten_thousand_jobs_of_one_transaction_all_run(
    start_dispatcher: Callable[..., DispatcherProcess],
    start_worker: Callable[..., WorkerProcess],
    ledger: Path,
    redis_url: str,
    db_url: str,
) -> None:
    dispatcher = start_dispatcher(redis_url, db_url)
    start_worker(dispatcher.target, types=",".join(f"noop.bulk{i}" for i in range(16)), concurrency=256)
    with psycopg.connect(db_url) as conn:
        jobs = [{"type": f"noop.bulk{i % 16}", "payload": {"i": i}} for i in range(10_000)]
        ids = enqueue_many_in_transaction(conn, jobs)
        conn.commit()
    assert len(set(ids)) == 10_000
    wait_started(ledger, set(ids), timeout=90)
    runs = [e["job"] for e in events(ledger, "start")]
    assert len(runs) == 10_000  # each once


def test_with_the_listen_connection_killed_and_no_new_connection_possible_the_sweep_finds_the_jobs(
    start_dispatcher: Callable[..., DispatcherProcess],
    start_worker: Callable[..., WorkerProcess],
    ledger: Path,
    redis_url: str,
    db_url: str,
    pg_admin_url: str,
) -> None:
    dispatcher = start_dispatcher(redis_url, db_url, sql_enqueue_sweep_s=0.5)
    start_worker(dispatcher.target, types="noop.swept")
    name = db_url.rsplit("/", 1)[1]
    producer = psycopg.connect(db_url)  # opened before the database refuses new connections
    try:
        listener = wait_until(
            lambda: query(
                pg_admin_url,
                "SELECT pid FROM pg_stat_activity WHERE datname = ? AND query = 'LISTEN shardq_enqueued'",
                (name,),
            ),
            timeout=10,
        )
        # The dispatcher cannot listen again: every notification of the commit below goes unheard.
        query(pg_admin_url, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            assert query(pg_admin_url, "SELECT pg_terminate_backend(?)", (listener[0][0],)) == [(True,)]
            wait_until(
                lambda: "not listening for SQL enqueues" in dispatcher.log_tail(200),
                timeout=10,
                message="the dispatcher did not notice its LISTEN connection was gone",
            )
            ids = set(enqueue_many_in_transaction(producer, [{"type": "noop.swept", "payload": {}}] * 5))
            producer.commit()
            wait_started(ledger, ids)
        finally:
            query(pg_admin_url, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        # Listening again, it is the notification that queues a job, well within a sweep's interval.
        wait_until(
            lambda: query(
                pg_admin_url,
                "SELECT pid FROM pg_stat_activity WHERE datname = ? AND query = 'LISTEN shardq_enqueued'",
                (name,),
            ),
            timeout=15,
        )
        again = enqueue_in_transaction(producer, "noop.swept", {})
        producer.commit()
        wait_started(ledger, {again})
    finally:
        producer.close()


def test_bad_input_names_the_field_and_inserts_nothing(
    start_dispatcher: Callable[..., DispatcherProcess], redis_url: str, db_url: str
) -> None:
    from worker_sdk import InvalidArgumentError

    start_dispatcher(redis_url, db_url)
    with psycopg.connect(db_url) as conn:
        with pytest.raises(
            InvalidArgumentError, match=r"^INVALID_ARGUMENT: jobs\[1\]\.max_attempts: must be in"
        ):
            enqueue_many_in_transaction(
                conn, [{"type": "noop.ok", "payload": {}}, {"type": "noop.ok", "max_attempts": 5000}]
            )
        conn.rollback()
    assert query(db_url, "SELECT COUNT(*) FROM jobs") == [(0,)]
    assert query(db_url, "SELECT COUNT(*) FROM jobs_to_push") == [(0,)]
