"""Operations: Prometheus metrics moving as jobs flow (one process and a supervisor), gRPC health."""

from __future__ import annotations

import signal
import subprocess
import sys

import psutil
import pytest

from tests.support.ports import free_port
from tests.support.scrape import samples
from tests.support.wait import wait_until
from worker_sdk import Client

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def scrape(port: int) -> dict[str, float]:
    """Sum of every sample by metric name and the interesting label (state / nothing)."""
    out: dict[str, float] = {}
    for sample in samples(port):
        key = sample.name + (f"[{sample.labels['state']}]" if "state" in sample.labels else "")
        out[key] = out.get(key, 0.0) + sample.value
    return out


def dependencies_up(port: int) -> dict[str, float]:
    return {s.labels["dependency"]: s.value for s in samples(port) if s.name == "shardq_dependency_up"}


@pytest.mark.parametrize("processes", [1, 2])
def test_metrics_move_as_jobs_flow(processes, start_dispatcher, redis_url, db_url, start_worker, ledger):
    port = free_port()
    proc = start_dispatcher(redis_url, db_url, processes=processes, metrics_listen=f"127.0.0.1:{port}")
    with Client(proc.target) as client:
        wait_until(lambda: len([m for m in client.shard_map().members if m.alive]) == processes, timeout=30)
        client.enqueue_many([{"type": f"noop{i % 3}"} for i in range(60)])
        client.enqueue("noop0", None, delay=3600)
        wait_until(
            lambda: scrape(port).get("shardq_queue_depth[ready]") == 60,
            timeout=10,
            message=lambda: str(scrape(port)),
        )
        before = scrape(port)
        assert before["shardq_jobs_enqueued_total"] == 61
        assert before["shardq_queue_depth[delayed]"] == 1
        assert before["shardq_oldest_ready_age_seconds"] >= 0
        assert before.get("shardq_dispatchers_alive") == processes
        assert before.get("shardq_shard_epoch", 0) > 0
        # read from the DB at the table keeper's first pass, before the process serves
        assert before.get("shardq_db_table_bytes", 0) > 0
        wait_until(lambda: _ownership(port) == (0, processes), timeout=10)
        wait_until(lambda: dependencies_up(port) == {"redis": 1, "database": 1}, timeout=10)
        start_worker(proc.target, types="noop0,noop1,noop2,final0", concurrency=8)
        wait_until(
            lambda: scrape(port).get("shardq_jobs_acked_total") == 60,
            timeout=30,
            message=lambda: str(scrape(port)),
        )
        after = scrape(port)
        assert after.get("shardq_queue_depth[ready]", 0) == 0
        assert after["shardq_jobs_leased_total"] == 60
        assert after["shardq_enqueue_to_start_seconds_count"] == 60
        assert after["shardq_start_lateness_seconds_count"] == 60
        wait_until(lambda: scrape(port).get("shardq_connected_workers", 0) >= 1, timeout=10)
        # A job that fails for good lands in the dead-letter queue; the depth gauge follows the DB.
        assert after.get("shardq_dead_letter_depth", 0) == 0
        client.enqueue("final0", None)
        wait_until(lambda: scrape(port).get("shardq_dead_letter_depth", 0) == 1, timeout=20)
        assert scrape(port)["shardq_jobs_dead_lettered_total"] == 1

    if processes == 2:
        # Every dispatcher frozen: their ownership leases lapse and nobody can take the shards over,
        # while the supervisor still serves /metrics. That is what the no-owner alert looks for.
        children = psutil.Process(proc.process.pid).children()
        assert len(children) == 2
        describe = lambda: str(scrape(port))  # noqa: E731
        try:
            for child in children:
                child.send_signal(signal.SIGSTOP)
            # (shards without owner, dispatchers alive): 8 shards in these tests.
            wait_until(lambda: _ownership(port) == (8, 0), timeout=30, interval=0.2, message=describe)
        finally:
            for child in children:
                child.send_signal(signal.SIGCONT)
        wait_until(lambda: _ownership(port) == (0, 2), timeout=30, interval=0.2, message=describe)


def _ownership(port: int) -> tuple[float | None, float | None]:
    metrics = scrape(port)
    return metrics.get("shardq_shards_without_owner"), metrics.get("shardq_dispatchers_alive")


def _health(target: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dispatcher.cli.ctl", "--target", target, "--timeout", "3", "health"],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_health_follows_redis(start_dispatcher, private_redis, db_url):
    port = free_port()
    proc = start_dispatcher(private_redis.url, db_url, metrics_listen=f"127.0.0.1:{port}")
    wait_until(lambda: _health(proc.target).returncode == 0, timeout=15)
    assert "SERVING" in _health(proc.target).stdout
    wait_until(lambda: dependencies_up(port) == {"redis": 1, "database": 1}, timeout=10)
    private_redis.kill()
    wait_until(lambda: _health(proc.target).returncode != 0, timeout=20)
    result = _health(proc.target)
    assert "NOT_SERVING" in result.stderr and result.stdout == ""
    # The metric says which dependency is down (the health check only that one is).
    wait_until(lambda: dependencies_up(port) == {"redis": 0, "database": 1}, timeout=10)
    private_redis.start()
    wait_until(lambda: _health(proc.target).returncode == 0, timeout=30)
    wait_until(lambda: dependencies_up(port) == {"redis": 1, "database": 1}, timeout=10)


def test_sigusr1_logs_what_every_task_waits_on(dispatcher):
    """``kill -USR1`` makes the dispatcher log each asyncio task with the chain of coroutines it is
    suspended in: what an operator looks at when it is up but does nothing. It goes on serving."""
    dispatcher.signal(signal.SIGUSR1)
    wait_until(lambda: "tasks dumped" in dispatcher.log_tail(400), timeout=10)
    dumped = [line for line in dispatcher.log_tail(400).splitlines() if '"event": "task"' in line]
    coordinator = next(line for line in dumped if '"task": "coordinator"' in line)
    assert "coordinator.py" in coordinator
    assert dispatcher.ready()
