"""Once an enqueue commits, nothing that fails after the commit turns its answer into an error: the
client would send the jobs again and they would run twice."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable, Iterator
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
