"""The work a benchmark job's handler does (bench/peers/_work.py), against a real redis-server: the
``redis`` kind makes one round trip per job that the harness can count, in the sync and async form."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import redis

from bench.peers import _work
from bench.peers._probe import REDIS_URL_ENV

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def work_env(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> redis.Redis:
    monkeypatch.setenv(REDIS_URL_ENV, redis_url)
    return redis.Redis.from_url(redis_url)


def test_noop_work_is_none_so_handlers_do_nothing_more(work_env: redis.Redis) -> None:
    assert _work.sync_work(4) is None
    assert _work.async_work(4) is None


def test_sync_redis_work_counts_each_job_and_sets_its_key(
    work_env: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_work.WORK_ENV, "redis")
    work = _work.sync_work(2)
    assert isinstance(work, _work.SyncRoundTrip)
    for seq in (1, 2, 3):
        work(seq)
    work.close()
    assert int(work_env.get(_work.COUNT_KEY)) == 3
    assert work_env.get("bench:work:2") == b"2"


async def test_async_redis_work_runs_more_jobs_at_once_than_its_pool_has_connections(
    work_env: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    monkeypatch.setenv(_work.WORK_ENV, "redis")
    work = _work.async_work(4)
    assert isinstance(work, _work.AsyncRoundTrip)
    await asyncio.gather(*(work(seq) for seq in range(50)))  # the pool makes the rest wait, never fails
    await work.aclose()
    assert int(work_env.get(_work.COUNT_KEY)) == 50
    assert work_env.get("bench:work:49") == b"49"


@pytest.mark.serial
def test_cpu_work_takes_about_its_time(work_env: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_work.WORK_ENV, "cpu100us")
    work = _work.sync_work(1)
    assert work is not None
    timings = []
    for seq in range(30):
        t0 = time.perf_counter()
        work(seq)
        timings.append(time.perf_counter() - t0)
    # The fastest run is the one no other process interrupted; the bounds leave room for a calibration
    # itself slowed by a busy machine.
    assert 30e-6 < min(timings) < 1e-3, min(timings)


def test_an_unknown_kind_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_work.WORK_ENV, "redis2")
    with pytest.raises(ValueError, match="BENCH_WORK='redis2'"):
        _work.sync_work(1)


def test_the_driver_chosen_concurrency_wins_over_the_pinned_one(monkeypatch: pytest.MonkeyPatch) -> None:
    pinned = {"noop": 64, "redis": 32, "io1ms": 16, "cpu100us": 8}
    monkeypatch.setenv(_work.WORK_ENV, "io1ms")
    assert _work.concurrency(pinned) == 16
    monkeypatch.setenv(_work.CONCURRENCY_ENV, "500")
    assert _work.concurrency(pinned) == 500


@pytest.mark.serial
@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_bullmq_cpu_work_takes_about_its_time_too() -> None:
    """The JavaScript twin (bench/peers/bullmq/work.js) is calibrated the same way; V8 must neither
    drop the loop nor run it faster than it was timed (a loop whose products outgrew 31 bits was
    timed on floating point and then ran 7x faster on small integers)."""
    script = (  # the fastest of 5 batches of 500 calls, in µs of CPU per call
        "const w = require('./work').makeWork(); let best = Infinity;"
        "(async () => { for (let b = 0; b < 5; b++) { const c = process.cpuUsage();"
        " for (let i = 0; i < 500; i++) await w(i);"
        " const d = process.cpuUsage(c); best = Math.min(best, (d.user + d.system) / 500); }"
        " console.log(best); })();"
    )
    folder = ROOT / "bench" / "peers" / "bullmq"
    env = {**os.environ, _work.WORK_ENV: "cpu100us"}
    done = subprocess.run(
        ["node", "-e", script], cwd=folder, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    best_us = float(done.stdout.strip())
    assert 30 < best_us < 1000, best_us
