"""A dispatcher host's system clock stepping by minutes (NTP, a resumed VM, an operator), while a
dispatcher runs or between two dispatchers' starts.

The design (shardq_common/clock.py): deadlines and durations (leases, reconnect grace, ownership and
membership, deferred status writes) run on a steady clock, Redis's TIME at process start plus the
host's boot clock since, so a step changes none of them; run_at (delayed jobs, retry backoff) is
wall time, so a job is due when the dispatcher's wall clock says so. The step is made through the
clock's test hook, SHARDQ_TEST_CLOCK_OFFSET_FILE (an offset added to the system clock of the
processes that read that file).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import redis

from dispatcher.queue.keys import ALIVE_KEY
from tests.support.processes import read_ledger
from tests.support.raw_worker import RawWorker
from tests.support.snapshots import db_status
from tests.support.wait import wait_for, wait_until
from worker_sdk import AsyncClient, Client

STEP_MS = 10 * 60 * 1000  # ten minutes: far beyond every TTL and grace in play


class ClockOffset:
    """The offset file one dispatcher's clock reads (rewritten atomically)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.set(0)

    def set(self, offset_ms: int) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(str(offset_ms))
        os.replace(tmp, self.path)


def starts(ledger: Path, job_id: str) -> list[dict]:
    return [e for e in read_ledger(ledger) if e["event"] == "start" and e["job"] == job_id]


def test_forward_step_expires_no_running_lease_and_run_at_follows_the_wall_clock(
    start_dispatcher, redis_url, tmp_path, start_worker, ledger
):
    clock = ClockOffset(tmp_path / "clock-offset")
    db_url = f"sqlite:///{tmp_path}/shardq.sqlite3"
    proc = start_dispatcher(redis_url, db_url, test_clock_offset_file=clock.path)
    with Client(proc.target, timeout=20) as client:
        start_worker(proc.target, types="sleep_clock,noop_clock", concurrency=4)
        # Default lease TTL (60 s): the worker's first heartbeat is 20 s away, so nothing but the
        # lease's own deadline keeps this job from being reaped after the step.
        running = client.enqueue("sleep_clock", {"sleep": 3})
        wait_until(lambda: starts(ledger, running), timeout=15, message="the long job never started")
        soon = client.enqueue("noop_clock", {"due": "in 5 min"}, run_at=time.time() + 300)
        later = client.enqueue("noop_clock", {"due": "in 20 min"}, run_at=time.time() + 1200)
        assert client.get_job(soon).status == "delayed"
        clock.set(STEP_MS)

        # run_at is wall time: after a 10-minute step the job due in 5 minutes is due now.
        wait_until(
            lambda: client.get_job(soon).status == "succeeded",
            timeout=15,
            message=lambda: f"the job due in 5 min did not run after the step: {client.get_job(soon)}",
        )
        wait_until(lambda: client.get_job(running).status == "succeeded", timeout=15)
        job = client.get_job(running)
        assert (job.attempts, job.expirations, job.failures) == (1, 0, 0), (
            f"the step expired a running lease: {job}\n{proc.log_tail(15)}"
        )
        assert len(starts(ledger, running)) == 1
        assert client.get_job(later).status == "delayed"
        wait_until(lambda: db_status(db_url, running) == "succeeded", timeout=10)


async def test_backward_step_stretches_no_lease_and_delays_no_retry_or_status_write(
    start_dispatcher, redis_url, tmp_path
):
    clock = ClockOffset(tmp_path / "clock-offset")
    db_url = f"sqlite:///{tmp_path}/shardq.sqlite3"
    proc = start_dispatcher(redis_url, db_url, test_clock_offset_file=clock.path)
    client = AsyncClient(proc.target, timeout=20)
    worker = RawWorker(proc.target)
    try:
        job_id = await client.enqueue("hang_clock", {}, lease_ttl=1.5, max_attempts=3)
        await worker.hello("hung-worker", ["hang_clock"], concurrency=1)
        await worker.credit(1)
        [lease] = (await worker.next_of("leases")).leases
        assert lease.ref.job_id == job_id and lease.attempt == 1
        # The step comes after the lease (and its deferred row write) were made on the old time.
        clock.set(-STEP_MS)
        # The deferred "leased" row write (1 s) is a duration: it is not put off by the step.
        await wait_for(
            lambda: db_status(db_url, job_id) == "leased",
            timeout=8,
            interval=0.1,
            message=lambda: f"DB row still {db_status(db_url, job_id)!r} 8 s after the lease",
        )
        # The worker hangs (stream open, no heartbeat): the 1.5 s lease expires on time, not in 10 min.
        started = time.monotonic()

        async def expired() -> bool:
            return (await client.get_job(job_id)).expirations == 1

        await wait_for(
            expired,
            timeout=10,
            interval=0.1,
            message=lambda: f"the lease did not expire within 10 s:\n{proc.log_tail(10)}",
        )
        took = time.monotonic() - started
        # The retry's backoff (1 s) counts from the wall clock, like the promoter does: it is due in
        # about a second, not ten minutes later.
        await worker.credit(1)
        [again] = (await worker.next_of("leases", timeout=15)).leases
        assert again.ref.job_id == job_id and again.attempt == 2
        assert again.ref.token != lease.ref.token
        print(f"lease expired {took:.1f} s after the backward step (TTL 1.5 s)")
    finally:
        await worker.close()
        await client.close()


def alive_score(redis_url: str, member: str) -> float | None:
    with redis.Redis.from_url(redis_url) as r:
        return r.zscore(ALIVE_KEY, member)


def wait_ticks(redis_url: str, member: str, n: int, timeout: float = 15.0) -> None:
    """Until ``member`` has renewed its membership ``n`` more times (each tick also places shards)."""
    seen = [alive_score(redis_url, member)]

    def renewed() -> bool:
        score = alive_score(redis_url, member)
        if score != seen[-1]:
            seen.append(score)
        return len(seen) > n

    wait_until(renewed, timeout=timeout, interval=0.05, message=f"{member} did not tick {n} times")


def test_one_members_clock_step_moves_no_shard(start_dispatcher, redis_url, tmp_path):
    """Two dispatchers; one's clock steps forward, then back. Membership and ownership are steady
    time, so neither sees the other as dead and no shard changes owner or epoch."""
    clock = ClockOffset(tmp_path / "clock-offset")
    db_url = f"sqlite:///{tmp_path}/shardq.sqlite3"
    a = start_dispatcher(redis_url, db_url, dispatcher_id="clock-a", test_clock_offset_file=clock.path)
    b = start_dispatcher(redis_url, db_url, dispatcher_id="clock-b")
    with Client(a.target, timeout=20) as client:

        def ownership() -> dict[int, tuple[str, int]]:
            return {s.shard: (s.owner, s.epoch) for s in client.shard_map().shards}

        def settled() -> dict[int, tuple[str, int]] | None:
            owners = ownership()
            return owners if {o for o, _ in owners.values()} == {"clock-a", "clock-b"} else None

        wait_until(settled, timeout=30, interval=0.2, message=lambda: f"shards never split: {ownership()}")
        wait_ticks(redis_url, "clock-a", 2)
        wait_ticks(redis_url, "clock-b", 2)
        before = settled()
        assert before is not None
        for offset in (STEP_MS, -STEP_MS):
            clock.set(offset)
            wait_ticks(redis_url, "clock-a", 3)
            wait_ticks(redis_url, "clock-b", 2)
            assert ownership() == before, f"after a {offset / 60000:+.0f} min step of clock-a"
            assert a.ready() and b.ready()


@pytest.mark.parametrize("step_ms", [STEP_MS, -STEP_MS], ids=["forward", "backward"])
def test_a_step_between_two_members_starts_leaves_their_steady_clocks_agreeing(
    start_dispatcher, redis_url, tmp_path, step_ms
):
    """The host's wall clock steps by ten minutes between the starts of two dispatchers (both read
    one clock offset: one host). Deadlines one writes the other compares, so their steady clocks
    must still agree: each sees the other alive, the shards split between them and stay put, and
    when one is killed the other takes its shards after the ownership TTL, not ten minutes late."""
    clock = ClockOffset(tmp_path / "clock-offset")
    db_url = f"sqlite:///{tmp_path}/shardq.sqlite3"
    ttl_ms = 2000
    a = start_dispatcher(
        redis_url, db_url, dispatcher_id="early", ownership_ttl_ms=ttl_ms, test_clock_offset_file=clock.path
    )
    clock.set(step_ms)
    b = start_dispatcher(
        redis_url, db_url, dispatcher_id="late", ownership_ttl_ms=ttl_ms, test_clock_offset_file=clock.path
    )
    with Client(a.target, timeout=20) as client:

        def ownership() -> dict[int, tuple[str, int]]:
            return {s.shard: (s.owner, s.epoch) for s in client.shard_map().shards}

        def split() -> dict[int, tuple[str, int]] | None:
            owners = ownership()
            return owners if {o for o, _ in owners.values()} == {"early", "late"} else None

        wait_until(split, timeout=30, interval=0.2, message=lambda: f"shards never split: {ownership()}")
        wait_ticks(redis_url, "early", 2)
        wait_ticks(redis_url, "late", 2)
        before = split()
        # Each renews its membership at its own steady now plus the TTL: one clock, scores close.
        apart_ms = abs(alive_score(redis_url, "early") - alive_score(redis_url, "late"))
        assert apart_ms < ttl_ms, f"membership deadlines {apart_ms / 1000:.1f} s apart"
        wait_ticks(redis_url, "early", 3)
        wait_ticks(redis_url, "late", 3)
        assert ownership() == before
        # The late one's wall clock is the step away from Redis's: its run_at times are, too.
        for member, apart in ((a, 0), (b, step_ms)):
            [anchored] = [
                json.loads(line)
                for line in member.log_tail(100_000).splitlines()
                if "steady clock anchored on redis time" in line
            ]
            assert abs(anchored["wall_clock_ahead_ms"] - apart) < 1000, anchored
            assert anchored["level"] == ("warning" if apart else "info"), anchored

        b.kill()
        killed_at = time.monotonic()
        wait_until(
            lambda: {o for o, _ in ownership().values()} == {"early"},
            timeout=30,
            interval=0.2,
            message=lambda: f"the killed member's shards were not taken over: {ownership()}",
        )
        took = time.monotonic() - killed_at
        assert took < 20, f"its shards were taken over {took:.1f} s after the kill"
