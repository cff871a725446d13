"""The job lifecycle end to end: real dispatcher and worker processes, real Redis, SQLite and PostgreSQL."""

from __future__ import annotations

import signal
import statistics
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tests.support.processes import read_ledger
from tests.support.scrape import metric_total
from tests.support.wait import wait_until
from worker_sdk import Client


def _starts(ledger: Path) -> list[dict]:
    return [e for e in read_ledger(ledger) if e["event"] == "start"]


def _ends(ledger: Path) -> list[dict]:
    return [e for e in read_ledger(ledger) if e["event"] == "end"]


def test_thousand_jobs_across_types_and_priorities_each_run_once(dispatcher, start_worker, ledger):
    types = ["noop_a", "noop_b", "noop_c", "noop_d"]
    for _ in range(2):
        start_worker(dispatcher.target, types=",".join(types), concurrency=8)
    with Client(dispatcher.target) as client:
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
        assert client.stats() == [] or all(q.ready == q.leased == q.delayed == 0 for q in client.stats())


def test_sigkill_worker_mid_job_reruns_it_elsewhere(dispatcher, start_worker, ledger):
    victim = start_worker(dispatcher.target, types="sleep,noop", concurrency=4)
    with Client(dispatcher.target) as client:
        slow = client.enqueue("sleep", {"sleep": 30, "sleep_attempts": 1}, lease_ttl=3)
        wait_until(lambda: any(e["job"] == slow for e in _starts(ledger)), timeout=20)
        survivor = start_worker(dispatcher.target, types="sleep,noop", concurrency=4)
        others = client.enqueue_many([{"type": "noop", "payload": {"i": i}} for i in range(50)])
        victim.kill()  # SIGKILL: no goodbye, the job's lease is still held
        killed_at = time.time()
        wait_until(lambda: client.get_job(slow).status == "succeeded", timeout=20)
        job = client.get_job(slow)
        assert job.attempts == 2 and job.expirations == 1 and job.failures == 0
        runs = [e for e in _starts(ledger) if e["job"] == slow]
        assert [r["pid"] for r in runs][0] == victim.process.pid
        assert runs[1]["pid"] == survivor.process.pid
        # Released after the reconnect grace (1 s here), not after the full TTL (3 s).
        assert runs[1]["t"] - killed_at < 2.9
        wait_until(lambda: all(client.get_job(i).status == "succeeded" for i in others), timeout=20)
        assert Counter(e["job"] for e in _starts(ledger) if e["job"] in set(others)).most_common(1)[0][1] == 1


def test_always_failing_job_backs_off_then_dead_letters_and_requeues(dispatcher, start_worker, ledger):
    start_worker(dispatcher.target, types="fail_always,noop")
    with Client(dispatcher.target) as client:
        job_id = client.enqueue("fail_always", {"x": 1})
        wait_until(lambda: client.get_job(job_id).status == "dead", timeout=30)
        job = client.get_job(job_id)
        assert job.attempts == 5 and job.failures == 5 and job.dead_reason == "handler_error"
        assert "always fails" in job.last_error
        times = [e["t"] for e in _starts(ledger) if e["job"] == job_id]
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        assert len(gaps) == 4
        for gap, expected in zip(gaps, [1, 2, 4, 8], strict=True):
            assert expected - 0.05 <= gap <= expected + 0.5, f"backoff gaps {gaps}"
        dead = client.dead_letters(job_type="fail_always")
        assert [d.id for d in dead] == [job_id]
        assert client.dead_letters(reason="lease_expired") == []
        assert client.requeue_dead([job_id]) == 1
        wait_until(lambda: len([e for e in _starts(ledger) if e["job"] == job_id]) == 6, timeout=10)
        wait_until(lambda: client.get_job(job_id).status == "delayed")  # failing again, with a fresh budget
        assert client.get_job(job_id).failures == 1


@pytest.mark.serial
def test_delayed_jobs_start_on_time_never_early(dispatcher, start_worker, ledger):
    start_worker(dispatcher.target, types="noop", concurrency=16)
    with Client(dispatcher.target) as client:
        client.enqueue("noop", {"warm": 1})
        wait_until(lambda: len(_ends(ledger)) == 1)
        ids = [client.enqueue("noop", {"i": i}, delay=0.5 + (i % 20) * 0.1) for i in range(100)]
        wait_until(lambda: len(_ends(ledger)) == 101, timeout=30)
    lags = [e["t"] - e["run_at"] for e in _starts(ledger) if e["job"] in set(ids)]
    assert len(lags) == 100
    assert min(lags) >= 0, f"a delayed job started {-min(lags) * 1000:.1f} ms early"
    assert statistics.median(lags) < 0.050, f"median start lag {statistics.median(lags) * 1000:.1f} ms"


def test_priority_flood_of_low_does_not_starve_high(dispatcher, start_worker, ledger):
    with Client(dispatcher.target) as client:
        client.enqueue_many(
            [{"type": "sleep_l", "payload": {"sleep": 0.01}, "priority": "low"} for _ in range(400)]
        )
        client.enqueue_many(
            [{"type": "sleep_h", "payload": {"sleep": 0.01}, "priority": "high"} for _ in range(40)]
        )
        start_worker(dispatcher.target, types="sleep_l,sleep_h", concurrency=2)
        wait_until(lambda: len(_ends(ledger)) >= 100, timeout=30)
    first = [e["priority"] for e in _starts(ledger)[:44]]
    # Weights 6:3:1 with nothing at default: high takes 9 of every 10 slots while it has jobs.
    assert first.count("high") >= 34, first


def test_priority_steady_high_still_lets_low_through(dispatcher, start_worker, ledger):
    with Client(dispatcher.target) as client:
        client.enqueue_many(
            [{"type": "sleep_h", "payload": {"sleep": 0.005}, "priority": "high"} for _ in range(300)]
        )
        client.enqueue_many(
            [{"type": "sleep_l", "payload": {"sleep": 0.005}, "priority": "low"} for _ in range(300)]
        )
        start_worker(dispatcher.target, types="sleep_l,sleep_h", concurrency=2)
        wait_until(lambda: len(_ends(ledger)) >= 200, timeout=30)
    first = [e["priority"] for e in _starts(ledger)[:200]]
    assert 10 <= first.count("low") <= 40, Counter(first)  # about one in ten


def test_strict_priority_setting(start_dispatcher, redis_url, db_url, start_worker, ledger):
    proc = start_dispatcher(redis_url, db_url, priority_weights="strict")
    with Client(proc.target) as client:
        client.enqueue_many([{"type": "noop_l", "priority": "low"} for _ in range(50)])
        client.enqueue_many([{"type": "noop_h", "priority": "high"} for _ in range(50)])
        start_worker(proc.target, types="noop_l,noop_h", concurrency=1)
        wait_until(lambda: len(_ends(ledger)) == 100, timeout=30)
    assert [e["priority"] for e in _starts(ledger)][:50] == ["high"] * 50


def test_idempotency_key_dedups(dispatcher, start_worker, ledger):
    with Client(dispatcher.target) as client:
        first = client.enqueue("noop", {"v": 1}, idempotency_key="order-42")
        again = client.enqueue("noop", {"v": 2}, idempotency_key="order-42")
        batch = client.enqueue_many(
            [
                {"type": "noop", "idempotency_key": "order-42"},
                {"type": "noop", "idempotency_key": "order-43"},
                {"type": "noop", "idempotency_key": "order-43"},
            ]
        )
        assert again == first and batch[0] == first and batch[1] == batch[2] != first
        start_worker(dispatcher.target, types="noop")
        wait_until(lambda: len(_ends(ledger)) == 2, timeout=20)
        assert client.get_job(first).payload == b'{"v":1}'
        assert client.get_job(first).idempotency_key == "order-42"
    time.sleep(0.3)  # a duplicate would have run by now; the ledger must still have two runs
    assert sorted(e["job"] for e in _starts(ledger)) == sorted([first, batch[1]])


def test_cancel_delayed_and_running_jobs(dispatcher, start_worker, ledger):
    start_worker(dispatcher.target, types="sleep,noop", concurrency=2)
    with Client(dispatcher.target) as client:
        delayed = client.enqueue("noop", None, delay=1.0)
        assert client.cancel(delayed) == "cancelled"
        running = client.enqueue("sleep", {"sleep": 30})
        wait_until(lambda: any(e["job"] == running for e in _starts(ledger)), timeout=10)
        assert client.cancel(running) == "leased"
        wait_until(lambda: client.get_job(running).status == "cancelled", timeout=10)
        marker = client.enqueue("noop", {"after": True}, delay=1.2)
        wait_until(lambda: client.get_job(marker).status == "succeeded", timeout=10)
        assert client.get_job(delayed).status == "cancelled"
        assert [e["job"] for e in _starts(ledger)].count(running) == 1, "a cancelled job was retried"
        assert delayed not in [e["job"] for e in _starts(ledger)]
        assert client.cancel(marker) == "succeeded"


def test_cancel_while_the_lease_waits_for_run_at(start_dispatcher, redis_url, db_url, start_worker, ledger):
    """A delayed job is leased lease_ahead_ms before its run_at and its lease waits in the dispatcher
    until then: a cancel landing in that window takes the lease back (the job never runs), it does
    not report it running. Cancels aimed at 30 ms before each job's run_at land before the promotion,
    in the window or after the start; each outcome must hold to its word, and some must hit the
    window. The worker runs one job at a time: a slot lost with a withdrawn lease would stop it."""
    port = free_port()
    proc = start_dispatcher(redis_url, db_url, lease_ahead_ms=50, metrics_listen=f"127.0.0.1:{port}")
    start_worker(proc.target, types="sleep", concurrency=1)
    with Client(proc.target) as client:
        client.enqueue("sleep", {"sleep": 0})
        wait_until(lambda: len(_ends(ledger)) == 1)
        first = time.time() + 1.0
        run_ats = [first + i * 0.2 for i in range(20)]
        ids = [client.enqueue("sleep", {"sleep": 30}, run_at=t) for t in run_ats]
        outcomes = {}
        for job_id, run_at in zip(ids, run_ats, strict=True):
            time.sleep(max(0.0, run_at - 0.030 - time.time()))
            outcomes[job_id] = client.cancel(job_id)
        wait_until(lambda: all(client.get_job(i).status == "cancelled" for i in ids), timeout=20)
        marker = client.enqueue("sleep", {"sleep": 0}, delay=0.2)  # a lease sent late would be out by now
        wait_until(lambda: client.get_job(marker).status == "succeeded", timeout=10)
        jobs = {i: client.get_job(i) for i in ids}
    starts = {e["job"]: e for e in _starts(ledger)}
    assert all(e["t"] >= e["run_at"] for e in starts.values()), "a job started before its run_at"
    assert set(outcomes.values()) <= {"cancelled", "leased"}, outcomes
    for job_id, outcome in outcomes.items():
        assert (job_id in starts) == (outcome == "leased"), f"{job_id}: cancel said {outcome}"
        if outcome == "cancelled":
            assert jobs[job_id].attempts == 0, jobs[job_id]
    withdrawn = metric_total(port, "shardq_leases_returned_total", outcome="cancelled")
    assert withdrawn >= 1, f"no cancel landed while a lease waited: {Counter(outcomes.values())}"
    assert metric_total(port, "shardq_leases_returned_total", outcome="ready") == 0


def test_worker_lost_while_its_lease_waits_for_run_at(
    start_dispatcher, redis_url, db_url, start_worker, ledger
):
    """A worker that disconnects while a lease granted to it waits for the job's run_at never
    received it: the job is ready again at once with the attempt uncounted, not left to expire
    (an expiration counted, a backoff). The kill is aimed into the window; tries that miss it
    (before the promotion, after the start) are told apart by the metric."""
    port = free_port()
    proc = start_dispatcher(redis_url, db_url, lease_ahead_ms=50, metrics_listen=f"127.0.0.1:{port}")

    def returned() -> float:
        return metric_total(port, "shardq_leases_returned_total", outcome="ready")

    def one_try(n: int) -> tuple[str, bool]:
        victim = start_worker(proc.target, types="noop", concurrency=4)
        warm = client.enqueue("noop", {"warm": n})
        wait_until(lambda: client.get_job(warm).status == "succeeded", timeout=20)
        before = returned()
        run_at = time.time() + 1.0
        job_id = client.enqueue("noop", {"try": n}, run_at=run_at)
        time.sleep(max(0.0, run_at - 0.030 - time.time()))
        victim.kill()  # SIGKILL: the stream ends, with the lease unsent if the kill hit the window
        wait_until(lambda: proc.log_tail(10_000).count("worker disconnected") == n + 1, timeout=10)
        return job_id, returned() > before

    with Client(proc.target) as client:
        tries = []
        while len(tries) < 5 and not any(hit for _, hit in tries):
            tries.append(one_try(len(tries)))
        start_worker(proc.target, types="noop", concurrency=4)
        wait_until(lambda: all(client.get_job(j).status == "succeeded" for j, _ in tries), timeout=30)
        jobs = {j: client.get_job(j) for j, _ in tries}
    assert any(hit for _, hit in tries), f"no kill landed while a lease waited: {list(jobs.values())}"
    for job_id, hit in tries:
        if hit:
            assert (jobs[job_id].attempts, jobs[job_id].expirations) == (1, 0), jobs[job_id]
    starts = [e for e in _starts(ledger) if e["job"] in jobs]
    assert all(e["t"] >= e["run_at"] for e in starts), "a job started before its run_at"


@pytest.mark.parametrize("loss", ["flushall", "restart"])
def test_redis_data_loss_loses_no_job(loss, start_dispatcher, private_redis, db_url, start_worker, ledger):
    proc = start_dispatcher(private_redis.url, db_url)
    with Client(proc.target) as client:
        sleepers = client.enqueue_many(
            [{"type": "sleep", "payload": {"sleep": 1.5}, "lease_ttl": 30} for _ in range(8)]
        )
        start_worker(proc.target, types="sleep,noop", concurrency=8)
        ready = client.enqueue_many([{"type": "noop", "payload": {"i": i}} for i in range(600)])
        delayed = client.enqueue_many(
            [{"type": "noop", "payload": {"i": i}, "delay": 2.0} for i in range(400)]
        )
        wait_until(lambda: len({e["job"] for e in _starts(ledger)} & set(sleepers)) == 8, timeout=10)
        if loss == "flushall":
            private_redis.client().flushall()
        else:
            private_redis.restart()
        everything = set(sleepers + ready + delayed)
        wait_until(
            lambda: everything <= {e["job"] for e in _ends(ledger)},
            timeout=60,
            message=lambda: f"{len(everything - {e['job'] for e in _ends(ledger)})} jobs not done",
        )
        wait_until(
            lambda: all(client.get_job(i).status == "succeeded" for i in sleepers + delayed[:20]), timeout=20
        )


def test_worker_sigterm_finishes_in_flight_job(dispatcher, start_worker, ledger):
    worker = start_worker(dispatcher.target, types="sleep", concurrency=2, grace=10)
    with Client(dispatcher.target) as client:
        job_id = client.enqueue("sleep", {"sleep": 1.0})
        wait_until(lambda: any(e["job"] == job_id for e in _starts(ledger)), timeout=10)
        worker.process.send_signal(signal.SIGTERM)
        assert worker.process.wait(15) == 0
        assert [e["job"] for e in _ends(ledger)] == [job_id]
        wait_until(lambda: client.get_job(job_id).status == "succeeded", timeout=5)
        assert client.get_job(job_id).attempts == 1


def test_dispatcher_restart_keeps_worker_leases(dispatcher, start_worker, ledger):
    start_worker(dispatcher.target, types="sleep", concurrency=2)
    with Client(dispatcher.target) as client:
        job_id = client.enqueue("sleep", {"sleep": 3.0}, lease_ttl=30)
        wait_until(lambda: any(e["job"] == job_id for e in _starts(ledger)), timeout=10)
    dispatcher.restart()  # SIGTERM, then a new process on the same port
    with Client(dispatcher.target) as client:
        wait_until(lambda: client.get_job(job_id).status == "succeeded", timeout=20)
        job = client.get_job(job_id)
    assert job.attempts == 1 and job.expirations == 0, "the lease was lost across the restart"
    assert [e["job"] for e in _starts(ledger)] == [job_id]
