"""Once an enqueue commits, nothing that fails after the commit turns its answer into an error: the
client would send the jobs again and they would run twice."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from shardmap import shard_for
from tests.support.db import query, statuses
from tests.support.processes import DispatcherProcess, WorkerProcess, read_ledger
from tests.support.shard_map import settled_view
from tests.support.wait import wait_until
from worker_sdk import Client, ShardqError


@pytest.fixture
def redis_admin(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        client.config_set("maxmemory", 0)
        client.close()


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_a_hand_off_that_fails_with_redis_refusing_writes_still_answers_ok_and_the_owner_queues_the_jobs(
    start_dispatcher: Callable[..., DispatcherProcess],
    start_worker: Callable[..., WorkerProcess],
    ledger: Path,
    redis_url: str,
    redis_admin: redis.Redis,
    db_url: str,
) -> None:
    """The owner of the jobs' shard is frozen (its hand-off times out) and Redis is full (it refuses
    writes, so the shard cannot be flagged for its owner at once). The jobs are committed, so the
    enqueue answers OK with their ids; the flag is set once Redis takes writes again, and the owner,
    still the owner when it wakes, queues them: each runs once."""
    # A long ownership lease: the frozen owner keeps its shards, so only the flag can queue the jobs.
    owner = start_dispatcher(redis_url, db_url, dispatcher_id="d1", ownership_ttl_ms=60_000)
    committer = start_dispatcher(redis_url, db_url, dispatcher_id="d2", ownership_ttl_ms=60_000)
    view = wait_until(lambda: settled_view(committer.target, 2), timeout=30)
    owners = {s.shard: s.owner for s in view.shards}
    candidates = (f"noop.full{i}" for i in range(200))
    types = [t for t in candidates if owners[shard_for(t, view.shard_count)] == "d1"][:2]
    assert types, "d1 owns no shard"
    owner.signal(signal.SIGSTOP)
    try:
        redis_admin.config_set("maxmemory", 1)  # noeviction: every write is refused (OOM)
        with Client(committer.target, timeout=30) as client:
            try:
                ids = client.enqueue_many([{"type": types[i % 2], "payload": {"i": i}} for i in range(10)])
            except ShardqError as exc:
                pytest.fail(f"an enqueue committed to the DB answered {exc.code.name}: {exc}")
        redis_admin.config_set("maxmemory", 0)
    finally:
        owner.signal(signal.SIGCONT)
    assert len(ids) == 10
    assert sorted(r[0] for r in query(db_url, "SELECT id FROM jobs")) == sorted(ids)
    start_worker(owner.target, types=",".join(types))
    wait_until(lambda: set(statuses(db_url, ids).values()) == {"succeeded"}, timeout=30)
    runs = Counter(e["job"] for e in read_ledger(ledger) if e["event"] == "start")
    assert all(runs[job] == 1 for job in ids), runs


SLOW_INSERT = """
CREATE FUNCTION test_slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM new_rows WHERE type = 'noop.slow') THEN
    PERFORM pg_sleep(3);
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER test_slow_insert AFTER INSERT ON jobs REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION test_slow_insert();
"""


# PostgreSQL only: SQLite's write transactions exclude each other, so a purge cannot commit inside an
# enqueue's transaction.
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_an_idempotency_key_whose_job_is_purged_during_the_enqueue_still_answers_ok_with_every_id(
    dispatcher: DispatcherProcess,
    start_worker: Callable[..., WorkerProcess],
    ledger: Path,
    db_url: str,
) -> None:
    """The enqueue's insert skips its keyed job for the existing dead job with that key, and a purge
    deletes that job before the enqueue reads who owns the key (a trigger holds the enqueue between
    the two, in the database itself). The key is free again: the enqueue creates the job under it
    and answers OK with every id, so nothing is committed behind an error the client would retry."""
    start_worker(dispatcher.target, types="final.keyed,noop.slow,noop.keyed")
    with Client(dispatcher.target, timeout=30) as client:
        old = client.enqueue("final.keyed", {}, idempotency_key="k-1")
        wait_until(lambda: statuses(db_url, [old]) == {old: "dead"}, timeout=20)
        query(db_url, SLOW_INSERT)
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(
                client.enqueue_many,
                [
                    {"type": "noop.slow", "payload": {}},
                    {"type": "noop.keyed", "payload": {}, "idempotency_key": "k-1"},
                ],
            )
            wait_until(
                lambda: (
                    query(db_url, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'")
                    == [(1,)]
                ),
                timeout=10,
            )
            with Client(dispatcher.target, timeout=30) as other:
                assert other.purge_dead(job_type="final.keyed") == 1
            try:
                ids = answer.result(30)
            except ShardqError as exc:
                pytest.fail(f"an enqueue committed to the DB answered {exc.code.name}: {exc}")
    assert len(ids) == 2 and old not in ids
    rows = dict(query(db_url, "SELECT id, type FROM jobs"))
    assert rows == {ids[0]: "noop.slow", ids[1]: "noop.keyed"}
    wait_until(lambda: set(statuses(db_url, ids).values()) == {"succeeded"}, timeout=20)
    runs = Counter(e["job"] for e in read_ledger(ledger) if e["event"] == "start")
    assert runs[ids[0]] == 1 and runs[ids[1]] == 1, runs
