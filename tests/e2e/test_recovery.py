"""A dispatcher that dies with status updates not yet written: its successor writes them."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from dispatcher.queue.failpoints import CRASH_EXIT_CODE
from dispatcher.queue.keys import ShardKeys
from dispatcher.queue.records import JobRecord
from dispatcher.queue.states import JobState
from shardmap import shard_for
from tests.e2e.conftest import TEST_SETTINGS
from tests.support.db import query, statuses
from tests.support.processes import DispatcherProcess, WorkerProcess, read_ledger
from tests.support.shard_map import settled_view
from tests.support.wait import wait_until
from worker_sdk import Client, ShardqError


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_finished_jobs_a_crashed_dispatcher_did_not_record_are_recorded_by_the_next(
    start_dispatcher: Callable[..., DispatcherProcess],
    start_worker: Callable[..., WorkerProcess],
    ledger: Path,
    redis_url: str,
    db_url: str,
    tmp_path: Path,
) -> None:
    """Jobs acked (finished in Redis) while the dispatcher dies before committing their status: the
    rows still say ready. The next owner finds the finished records when it acquires the shard,
    writes their status, and does not run them again."""
    settings = {**TEST_SETTINGS, "dispatcher_id": "d1", "failpoints": "status.before-commit"}
    doomed = DispatcherProcess(redis_url, db_url, tmp_path, **settings).start()
    try:
        with Client(doomed.target) as client:
            # A short lease: a job whose ack died with the process runs again soon.
            ids = client.enqueue_many(
                [{"type": "noop.rec", "payload": {"i": i}, "lease_ttl": 2} for i in range(20)]
            )
        start_worker(doomed.target, types="noop.rec")
        assert doomed.process is not None
        assert doomed.process.wait(30) == CRASH_EXIT_CODE, doomed.log_tail()
    finally:
        doomed.kill()
    # What Redis finished before the crash; an ack still on its way when the process died is lost
    # with it, and that job runs again (at-least-once).
    finished = finished_in_redis(redis_url, ids)
    assert finished, "nothing was acked before the crash"
    assert set(statuses(db_url, sorted(finished)).values()) != {"succeeded"}, "the failpoint did not hold"
    successor = start_dispatcher(redis_url, db_url, dispatcher_id="d1")
    with Client(successor.target) as client:
        # In the DB itself (GetJob would show what Redis says).
        wait_until(lambda: set(statuses(db_url, sorted(finished)).values()) == {"succeeded"}, timeout=20)
        start_worker(successor.target, types="noop.rec")
        wait_until(lambda: set(statuses(db_url, ids).values()) == {"succeeded"}, timeout=20)
        time.sleep(0.5)
    runs = Counter(e["job"] for e in read_ledger(ledger) if e["event"] == "start")
    assert all(runs[job] == 1 for job in finished), "a finished job ran again"


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_results_of_finished_jobs_a_crashed_dispatcher_did_not_record_are_recorded_by_the_next(
    start_dispatcher: Callable[..., DispatcherProcess],
    start_worker: Callable[..., WorkerProcess],
    redis_url: str,
    db_url: str,
    tmp_path: Path,
) -> None:
    """A result acked with its job is kept with the finished record in Redis until the row holds
    it: a dispatcher that dies before committing the status leaves both to its successor, which
    records the job as succeeded with its result (binary, not UTF-8), never without it."""
    settings = {**TEST_SETTINGS, "dispatcher_id": "d1", "failpoints": "status.before-commit"}
    doomed = DispatcherProcess(redis_url, db_url, tmp_path, **settings).start()
    expected = {}
    try:
        with Client(doomed.target) as client:
            results = [bytes([0xFF, 0x00, i]) + b"result" * i for i in range(20)]
            ids = client.enqueue_many(
                [
                    {"type": "noop.res", "payload": {"i": i, "result_hex": r.hex()}, "lease_ttl": 2}
                    for i, r in enumerate(results)
                ]
            )
            expected = dict(zip(ids, results, strict=True))
        start_worker(doomed.target, types="noop.res")
        assert doomed.process is not None
        assert doomed.process.wait(30) == CRASH_EXIT_CODE, doomed.log_tail()
    finally:
        doomed.kill()
    finished = sorted(finished_in_redis(redis_url, ids))
    assert finished, "nothing was acked before the crash"
    assert set(statuses(db_url, finished).values()) != {"succeeded"}, "the failpoint did not hold"
    start_dispatcher(redis_url, db_url, dispatcher_id="d1")
    wait_until(lambda: set(statuses(db_url, finished).values()) == {"succeeded"}, timeout=20)
    marks = ", ".join("?" * len(finished))
    rows = query(db_url, f"SELECT id, result FROM jobs WHERE id IN ({marks})", tuple(finished))  # noqa: S608
    assert {job_id: bytes(result) if result is not None else None for job_id, result in rows} == {
        job_id: expected[job_id] for job_id in finished
    }


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_jobs_committed_but_not_yet_queued_when_the_dispatcher_died_run_on_the_next(
    start_dispatcher: Callable[..., DispatcherProcess],
    start_worker: Callable[..., WorkerProcess],
    ledger: Path,
    redis_url: str,
    db_url: str,
    tmp_path: Path,
) -> None:
    """An enqueue is acknowledged at its commit and queued in Redis behind the reply. A process that
    dies in between leaves rows Redis does not hold: the shard's next owner queues them when it
    acquires the shard, and each runs once."""
    settings = {**TEST_SETTINGS, "dispatcher_id": "d1", "failpoints": "ingest.before-queue"}
    doomed = DispatcherProcess(redis_url, db_url, tmp_path, **settings).start()
    try:
        with Client(doomed.target) as client:
            try:
                client.enqueue_many([{"type": "noop.late", "payload": {"i": i}} for i in range(20)])
            except ShardqError:
                pass  # the process may die before its reply leaves; the rows are committed either way
        assert doomed.process is not None
        assert doomed.process.wait(30) == CRASH_EXIT_CODE, doomed.log_tail()
    finally:
        doomed.kill()
    ids = [row[0] for row in query(db_url, "SELECT id FROM jobs WHERE type = 'noop.late'")]
    assert len(ids) == 20
    assert not held_in_redis(redis_url, ids), "the failpoint did not hold"
    successor = start_dispatcher(redis_url, db_url, dispatcher_id="d1")
    start_worker(successor.target, types="noop.late")
    wait_until(lambda: set(statuses(db_url, ids).values()) == {"succeeded"}, timeout=30)
    runs = Counter(e["job"] for e in read_ledger(ledger) if e["event"] == "start")
    assert all(runs[job] == 1 for job in ids), runs


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_jobs_handed_to_an_owner_that_died_before_queueing_them_run_on_its_successor(
    start_dispatcher: Callable[..., DispatcherProcess],
    start_worker: Callable[..., WorkerProcess],
    ledger: Path,
    redis_url: str,
    db_url: str,
    tmp_path: Path,
) -> None:
    """Jobs of another process's shards are handed to their owner, which answers once it has them
    and queues them behind that answer. An owner that dies in between leaves rows Redis does not
    hold: its successor queues them when it acquires the shard, and each runs once."""
    settings = {**TEST_SETTINGS, "dispatcher_id": "d1", "failpoints": "ingest.before-queue"}
    doomed = DispatcherProcess(redis_url, db_url, tmp_path, **settings).start()
    try:
        committer = start_dispatcher(redis_url, db_url, dispatcher_id="d2")
        view = wait_until(lambda: settled_view(committer.target, 2), timeout=30)  # d1 and d2
        with Client(committer.target) as client:
            owner = {s.shard: s.owner for s in view.shards}
            candidates = (f"noop.handed{i}" for i in range(200))
            types = [t for t in candidates if owner[shard_for(t, view.shard_count)] == "d1"][:3]
            assert types, "d1 owns no shard"
            # Through d2, which commits them and hands them to d1 (route=False: no client routing).
            ids = client.enqueue_many([{"type": types[i % 3], "payload": {"i": i}} for i in range(30)])
        assert doomed.process is not None
        assert doomed.process.wait(30) == CRASH_EXIT_CODE, doomed.log_tail()
    finally:
        doomed.kill()
    assert len(ids) == 30 and not held_in_redis(redis_url, ids), "the failpoint did not hold"
    successor = start_dispatcher(redis_url, db_url, dispatcher_id="d1")
    start_worker(successor.target, types=",".join(types))
    wait_until(lambda: set(statuses(db_url, ids).values()) == {"succeeded"}, timeout=30)
    runs = Counter(e["job"] for e in read_ledger(ledger) if e["event"] == "start")
    assert all(runs[job] == 1 for job in ids), runs


def held_in_redis(redis_url: str, ids: list[str]) -> set[str]:
    """The jobs Redis holds a record of, in any shard."""
    client = redis.Redis.from_url(redis_url)
    try:
        out = set()
        for key in client.scan_iter(match=ShardKeys(0).jobs.replace("{s0}", "{s*}")):
            out.update(job_id for job_id, raw in zip(ids, client.hmget(key, ids), strict=True) if raw)
        return out
    finally:
        client.close()


def finished_in_redis(redis_url: str, ids: list[str]) -> set[str]:
    """The jobs whose records in Redis say succeeded."""
    client = redis.Redis.from_url(redis_url)
    try:
        out = set()
        for key in client.scan_iter(match=ShardKeys(0).jobs.replace("{s0}", "{s*}")):
            for job_id, raw in zip(ids, client.hmget(key, ids), strict=True):
                if raw is not None and JobRecord.unpack(raw).state is JobState.SUCCEEDED:
                    out.add(job_id)
        return out
    finally:
        client.close()
