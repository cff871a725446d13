"""The core flows end to end on a real 3-master Redis Cluster: a real dispatcher process whose
SHARDQ_REDIS_URL is ``redis+cluster://...`` and real worker processes (SQLite only, for time).

The dispatcher's 8 shards spread over the three masters (their ``{sN}`` hash tags map to slots of
all three), so every flow crosses every master.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from pathlib import Path

import pytest

from dispatcher.queue.keys import ShardKeys
from tests.support.processes import DispatcherProcess, read_ledger
from tests.support.redis_cluster import RedisCluster3
from tests.support.wait import wait_until
from worker_sdk import Client

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)

SHARDS = 8  # tests/e2e/conftest.py TEST_SETTINGS


def _starts(ledger: Path) -> list[dict]:
    return [e for e in read_ledger(ledger) if e["event"] == "start"]


def _ends(ledger: Path) -> list[dict]:
    return [e for e in read_ledger(ledger) if e["event"] == "end"]


def _shards_per_master(cluster: RedisCluster3) -> Counter[int]:
    return Counter(cluster.port_for_key(ShardKeys(s).meta) for s in range(SHARDS))


@pytest.fixture
def cluster_dispatcher(start_dispatcher, redis_cluster_url: str, db_url: str) -> DispatcherProcess:
    return start_dispatcher(redis_cluster_url, db_url)


def test_thousand_jobs_across_types_and_priorities_each_run_once(
    cluster_dispatcher, redis_cluster, start_worker, ledger
):
    assert len(_shards_per_master(redis_cluster)) == 3, "the shards must span all three masters"
    types = ["noop_a", "noop_b", "noop_c", "noop_d"]
    for _ in range(2):
        start_worker(cluster_dispatcher.target, types=",".join(types), concurrency=8)
    with Client(cluster_dispatcher.target) as client:
        jobs = [
            {"type": types[i % 4], "payload": {"i": i}, "priority": ("high", "default", "low")[i % 3]}
            for i in range(1000)
        ]
        ids = client.enqueue_many(jobs)
        assert len(set(ids)) == 1000
        wait_until(
            lambda: len(_ends(ledger)) >= 1000, timeout=60, message=lambda: f"{len(_ends(ledger))} done"
        )
        per_job = Counter(e["job"] for e in _starts(ledger))
        assert set(per_job) == set(ids)
        assert max(per_job.values()) == 1, "a job ran twice although nothing failed"
        wait_until(lambda: client.get_job(ids[-1]).status == "succeeded")
        sample = [client.get_job(i) for i in ids[::97]]
        assert all(j.status == "succeeded" and j.attempts == 1 for j in sample)
        # Stats read every shard's counts in one pipeline, split over the three masters.
        assert client.stats() == [] or all(q.ready == q.leased == q.delayed == 0 for q in client.stats())
    # Every master holds shards of this dispatcher (their meta hashes at least).
    for node in redis_cluster.nodes:
        with node.client() as r:
            mine = [s for s in range(SHARDS) if redis_cluster.port_for_key(ShardKeys(s).meta) == node.port]
            assert mine and all(r.exists(ShardKeys(s).meta) for s in mine), (node.port, mine)


@pytest.mark.serial
def test_delayed_jobs_start_on_time_never_early(cluster_dispatcher, start_worker, ledger):
    start_worker(cluster_dispatcher.target, types="noop", concurrency=16)
    with Client(cluster_dispatcher.target) as client:
        client.enqueue("noop", {"warm": 1})
        wait_until(lambda: len(_ends(ledger)) == 1)
        ids = [client.enqueue("noop", {"i": i}, delay=0.5 + (i % 10) * 0.1) for i in range(60)]
        wait_until(lambda: len(_ends(ledger)) == 61, timeout=30)
    lags = [e["t"] - e["run_at"] for e in _starts(ledger) if e["job"] in set(ids)]
    assert len(lags) == 60
    assert min(lags) >= 0, f"a delayed job started {-min(lags) * 1000:.1f} ms early"
    assert statistics.median(lags) < 0.050, f"median start lag {statistics.median(lags) * 1000:.1f} ms"


def test_sigkill_worker_mid_job_reruns_it_elsewhere(cluster_dispatcher, start_worker, ledger):
    victim = start_worker(cluster_dispatcher.target, types="sleep,noop", concurrency=4)
    with Client(cluster_dispatcher.target) as client:
        slow = client.enqueue("sleep", {"sleep": 30, "sleep_attempts": 1}, lease_ttl=3)
        wait_until(lambda: any(e["job"] == slow for e in _starts(ledger)), timeout=20)
        survivor = start_worker(cluster_dispatcher.target, types="sleep,noop", concurrency=4)
        others = client.enqueue_many([{"type": "noop", "payload": {"i": i}} for i in range(50)])
        victim.kill()  # SIGKILL: no goodbye, the job's lease is still held
        killed_at = time.time()
        wait_until(lambda: client.get_job(slow).status == "succeeded", timeout=20)
        job = client.get_job(slow)
        assert job.attempts == 2 and job.expirations == 1 and job.failures == 0
        runs = [e for e in _starts(ledger) if e["job"] == slow]
        assert runs[0]["pid"] == victim.process.pid
        assert runs[1]["pid"] == survivor.process.pid
        # Released after the reconnect grace (1 s here), not after the full TTL (3 s).
        assert runs[1]["t"] - killed_at < 2.9
        wait_until(lambda: all(client.get_job(i).status == "succeeded" for i in others), timeout=20)
        assert Counter(e["job"] for e in _starts(ledger) if e["job"] in set(others)).most_common(1)[0][1] == 1


def test_always_failing_job_dead_letters_after_five_attempts(
    start_dispatcher, redis_cluster_url, db_url, start_worker, ledger
):
    proc = start_dispatcher(redis_cluster_url, db_url, retry_base_ms=50)  # SHARDQ_RETRY_BASE_MS
    start_worker(proc.target, types="fail_always,noop")
    with Client(proc.target) as client:
        job_ids = [client.enqueue("fail_always", {"x": i}) for i in range(4)]  # a few shards
        wait_until(lambda: all(client.get_job(j).status == "dead" for j in job_ids), timeout=20)
        for job_id in job_ids:
            job = client.get_job(job_id)
            assert job.attempts == 5 and job.failures == 5 and job.dead_reason == "handler_error"
            assert "always fails" in job.last_error
            times = [e["t"] for e in _starts(ledger) if e["job"] == job_id]
            gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
            assert len(gaps) == 4
            for gap, expected in zip(gaps, [0.05, 0.1, 0.2, 0.4], strict=True):
                assert expected - 0.01 <= gap <= expected + 0.5, f"backoff gaps {gaps}"
        assert sorted(d.id for d in client.dead_letters(job_type="fail_always")) == sorted(job_ids)
        assert client.requeue_dead(job_ids[:1]) == 1
        wait_until(lambda: len([e for e in _starts(ledger) if e["job"] == job_ids[0]]) == 6, timeout=10)


def test_flushall_of_every_master_loses_no_job(cluster_dispatcher, redis_cluster, start_worker, ledger):
    with Client(cluster_dispatcher.target) as client:
        sleepers = client.enqueue_many(
            [{"type": "sleep", "payload": {"sleep": 1.5}, "lease_ttl": 30} for _ in range(8)]
        )
        start_worker(cluster_dispatcher.target, types="sleep,noop", concurrency=8)
        ready = client.enqueue_many([{"type": "noop", "payload": {"i": i}} for i in range(600)])
        delayed = client.enqueue_many(
            [{"type": "noop", "payload": {"i": i}, "delay": 2.0} for i in range(400)]
        )
        wait_until(lambda: len({e["job"] for e in _starts(ledger)} & set(sleepers)) == 8, timeout=10)
        redis_cluster.flushall()  # every master: every shard's working set is gone
        everything = set(sleepers + ready + delayed)
        wait_until(
            lambda: everything <= {e["job"] for e in _ends(ledger)},
            timeout=60,
            message=lambda: f"{len(everything - {e['job'] for e in _ends(ledger)})} jobs not done",
        )
        wait_until(
            lambda: all(client.get_job(i).status == "succeeded" for i in sleepers + delayed[:20]), timeout=20
        )
