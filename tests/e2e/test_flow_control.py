"""Flow control end to end, on real dispatcher and worker processes: per-key concurrency limits with
workers SIGKILLed, a type's limit across three dispatcher processes and a handover, a rate limit, fair
share between tenants, pause through a restart and a FLUSHALL, and RateLimited.

Every check reads the workers' ledger (tests/support/worker_app.py): one line per start and end of an
execution, with its worker's pid and the job's concurrency key. The settings API itself is
tests/e2e/test_queue_settings.py; the scripts' invariants, tests/integration/test_flow_state_machine.py."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import pytest
import redis

from shardmap import shard_for
from tests.support.processes import read_ledger
from tests.support.shard_map import settled_view
from tests.support.wait import wait_until
from worker_sdk import Client

POSTGRES = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def executions(ledger: Path, killed: dict[int, float] | None = None) -> list[tuple[float, float, dict]]:
    """(start, end, start line) of every execution; one whose worker was SIGKILLed before its end
    ends at the kill."""
    killed = killed or {}
    starts: dict[tuple[str, int, int], dict] = {}
    ends: dict[tuple[str, int, int], float] = {}
    for e in read_ledger(ledger):
        run = (e["job"], e["attempt"], e["pid"])
        if e["event"] == "start":
            starts[run] = e
        elif e["event"] in ("end", "fail", "rate_limited"):
            ends[run] = e["t"]
    out = []
    for run, e in starts.items():
        end = ends.get(run, killed.get(e["pid"]))
        assert end is not None, f"execution {run} never ended and its worker was not killed"
        out.append((e["t"], end, e))
    return out


def most_at_once(runs: list[tuple[float, float, dict]]) -> int:
    """The most executions overlapping at one instant (an end at the instant of a start frees first)."""
    events = sorted([(start, 1) for start, _, _ in runs] + [(end, -1) for _, end, _ in runs])
    peak = current = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


def ended(ledger: Path) -> set[str]:
    return {e["job"] for e in read_ledger(ledger) if e["event"] == "end"}


def stays(predicate, seconds: float, message: str) -> None:
    """The predicate holds throughout ``seconds`` (checked every 50 ms): for what must NOT happen."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert predicate(), message
        time.sleep(0.05)


@POSTGRES
@pytest.mark.timeout(240)
def test_a_per_key_limit_holds_while_workers_are_killed(dispatcher, start_worker, ledger):
    """20 keys, at most 2 running per key, 4 workers of concurrency 50 (room for 200) and two of them
    SIGKILLed mid-run: no key ever runs 3 at once, and every job runs. A killed worker's lease keeps
    its key's slot until it lapses, so its interrupted execution (counted up to the kill) and the
    rerun never overlap past the limit either."""
    with Client(dispatcher.target) as client:
        client.set_queue_settings("sleep_keyed", key_concurrency=2)
        workers = [start_worker(dispatcher.target, types="sleep_keyed", concurrency=50) for _ in range(4)]
        jobs = [
            {"type": "sleep_keyed", "payload": {"sleep": 0.01}, "concurrency_key": f"tenant-{i % 20}"}
            for i in range(5000)
        ]
        ids = []
        for i in range(0, len(jobs), 1000):
            ids += client.enqueue_many(jobs[i : i + 1000])
        wait_until(lambda: len(ended(ledger)) >= 1000, timeout=60, message="the first 1,000 never ran")
        killed = {}
        for worker in workers[:2]:
            killed[worker.process.pid] = time.time()
            worker.kill()
            start_worker(dispatcher.target, types="sleep_keyed", concurrency=50)
        wait_until(
            lambda: set(ids) <= ended(ledger),
            timeout=180,
            message=lambda: f"{len(set(ids) - ended(ledger))} jobs never ran",
        )
    by_key = defaultdict(list)
    for run in executions(ledger, killed):
        by_key[run[2]["key"]].append(run)
    assert len(by_key) == 20
    peaks = {key: most_at_once(runs) for key, runs in by_key.items()}
    assert max(peaks.values()) <= 2, peaks
    assert max(peaks.values()) == 2, "the limit was never reached: the test shows nothing"


@POSTGRES
@pytest.mark.timeout(240)
def test_a_type_limit_holds_across_three_processes_and_a_handover(
    start_dispatcher, redis_url, db_url, start_worker, ledger
):
    """A limit of 5 for the type, 3 dispatcher processes and workers with room for 40: never more than
    5 running, through the stop of the process that owns the type's shard and a rebalance. The
    workers' own target is another process, as a Service address would be."""
    settings = {"shard_count": 8, "ownership_ttl_ms": 3000}
    procs = [start_dispatcher(redis_url, db_url, **settings) for _ in range(3)]
    wait_until(
        lambda: settled_view(procs[0].target, 3), timeout=30, message="3 processes never owned every shard"
    )
    with Client(procs[0].target) as client:
        client.rebalance()
        wait_until(
            lambda: settled_view(procs[0].target, 3), timeout=30, message="the rebalance never settled"
        )
        shard_map = client.shard_map()
        owner_id = next(s.owner for s in shard_map.shards if s.shard == shard_for("sleep_capped", 8))
        owner_address = next(m.address for m in shard_map.members if m.id == owner_id)
    owner = next(p for p in procs if p.target == owner_address)
    survivor = next(p for p in procs if p is not owner)
    with Client(survivor.target) as client:
        client.set_queue_settings("sleep_capped", concurrency=5)
        for _ in range(2):
            start_worker(survivor.target, types="sleep_capped", concurrency=20)
        ids = client.enqueue_many([{"type": "sleep_capped", "payload": {"sleep": 0.05}} for _ in range(300)])
        wait_until(lambda: len(ended(ledger)) >= 80, timeout=60, message="the first 80 never ran")
        owner.stop()  # hands its shards over; the workers reclaim their leases from the next owner
        wait_until(lambda: settled_view(survivor.target, 2), timeout=30, message="the handover never settled")
        client.rebalance()
        wait_until(
            lambda: set(ids) <= ended(ledger),
            timeout=120,
            message=lambda: f"{len(set(ids) - ended(ledger))} jobs never ran",
        )
    peak = most_at_once(executions(ledger))
    assert peak <= 5, f"{peak} running at once over the type's limit of 5"
    assert peak == 5, "the limit was never reached: the test shows nothing"


@pytest.mark.serial
@POSTGRES
@pytest.mark.timeout(120)
def test_a_rate_limit_paces_starts_and_charges_no_attempt(dispatcher, start_worker, ledger):
    """50 a second (burst 1) for 500 jobs: they start at 50 a second, within 10%, each at attempt 1."""
    with Client(dispatcher.target) as client:
        client.set_queue_settings("noop_rated", rate=(50, 1))
        start_worker(dispatcher.target, types="noop_rated", concurrency=32)
        ids = client.enqueue_many([{"type": "noop_rated"} for _ in range(500)])
        wait_until(lambda: set(ids) <= ended(ledger), timeout=60, message="the jobs never all ran")
        jobs = [client.get_job(i) for i in ids[:50]]
    starts = sorted(e["t"] for e in read_ledger(ledger) if e["event"] == "start")
    rate = (len(starts) - 1) / (starts[-1] - starts[0])
    assert 45 <= rate <= 55, f"{rate:.1f} starts a second for a limit of 50"
    per_second = defaultdict(int)
    for t in starts:
        per_second[int(t - starts[0])] += 1
    full_seconds = [per_second[s] for s in range(1, int(starts[-1] - starts[0]))]
    assert max(full_seconds) <= 55, per_second  # no second ran ahead
    assert {e["attempt"] for e in read_ledger(ledger)} == {1}
    assert all(j.attempts == 1 and j.failures == 0 for j in jobs)


@POSTGRES
@pytest.mark.timeout(180)
def test_a_small_tenant_is_not_stuck_behind_a_big_one(dispatcher, start_worker, ledger):
    """Tenant A queues 20,000 jobs, then tenant B 20: B's jobs take turns with A's. The bound: once
    B's enqueue is answered, B's 20 all start before A starts 20 (its turns) + 3 x the worker's
    concurrency (leases already granted or on their way when B's jobs arrived, and the next credit's
    round). First in, first out would run every A job queued before them first: thousands. Counted
    from the answer, not the call: A's jobs keep starting while the call commits, a round of 32 every
    few milliseconds, and a busy machine's slower commit is no unfairness."""
    concurrency = 32
    with Client(dispatcher.target) as client:
        start_worker(dispatcher.target, types="noop_tenants", concurrency=concurrency)
        a_jobs = []
        for _ in range(4):
            a_jobs += client.enqueue_many(
                [{"type": "noop_tenants", "concurrency_key": "A"} for _ in range(5000)]
            )
        wait_until(lambda: len(ended(ledger)) >= 2000, timeout=60, message="tenant A's jobs never started")
        b_jobs = client.enqueue_many([{"type": "noop_tenants", "concurrency_key": "B"} for _ in range(20)])
        b_answered = time.time()
        wait_until(lambda: set(b_jobs) <= ended(ledger), timeout=60, message="tenant B's jobs never ran")
        lines = read_ledger(ledger)
        b_last = max(e["t"] for e in lines if e["event"] == "start" and e["key"] == "B")
        a_between = sum(
            1 for e in lines if e["event"] == "start" and e["key"] == "A" and b_answered < e["t"] <= b_last
        )
        a_left = len(a_jobs) - sum(1 for e in lines if e["event"] == "start" and e["key"] == "A")
        wait_until(lambda: set(a_jobs) <= ended(ledger), timeout=120, message="tenant A's jobs never all ran")
    bound = 20 + 3 * concurrency
    assert a_between <= bound, f"A started {a_between} jobs while B's 20 waited (bound {bound})"
    assert a_left > 1000, "A's backlog ran out before B's jobs were done: the test shows nothing"


@POSTGRES
@pytest.mark.timeout(180)
def test_a_pause_holds_through_a_restart_and_a_flushall(dispatcher, redis_url, start_worker, ledger):
    """Paused: nothing starts for 3 s, nor after the dispatcher restarts, nor after Redis loses
    everything and the jobs come back from the DB; resumed: every job runs."""
    with Client(dispatcher.target) as client:
        client.pause_queue("noop_paused")
        start_worker(dispatcher.target, types="noop_paused", concurrency=8)
        ids = client.enqueue_many([{"type": "noop_paused"} for _ in range(30)])
        nothing_started = lambda: not read_ledger(ledger)  # noqa: E731
        stays(nothing_started, 3.0, "a job started while its queue was paused")
    dispatcher.restart()
    stays(nothing_started, 2.0, "a job started after the restart of a paused queue's dispatcher")
    r = redis.Redis.from_url(redis_url)
    try:
        r.flushall()
        # The jobs come back from the DB (the shard is found lost, acquired again and reconciled).
        wait_until(
            lambda: sum(r.hlen(key) for key in r.scan_iter("shardq:*:jobs")) == len(ids),
            timeout=60,
            message="the jobs were not restored after the FLUSHALL",
        )
    finally:
        r.close()
    stays(nothing_started, 2.0, "a job started after a FLUSHALL of a paused queue")
    with Client(dispatcher.target) as client:
        client.resume_queue("noop_paused")
        wait_until(lambda: set(ids) <= ended(ledger), timeout=30, message="the jobs did not run after resume")


@SQLITE
@pytest.mark.timeout(120)
def test_rate_limited_goes_back_uncharged_and_holds_its_key(dispatcher, start_worker, ledger):
    """A handler raises RateLimited(retry_after=1, hold_siblings=True): its job runs again a second
    later at the same attempt, counted apart, and a sibling of the same key waits as long, while a job
    of another key does not."""
    with Client(dispatcher.target) as client:
        start_worker(dispatcher.target, types="limited_api", concurrency=8)
        limited = client.enqueue(
            "limited_api",
            {"retry_after": 1.0, "hold_siblings": True, "limited_times": 1},
            concurrency_key="acme",
        )
        wait_until(
            lambda: any(e["event"] == "rate_limited" for e in read_ledger(ledger)),
            timeout=30,
            message="the handler never raised RateLimited",
        )
        sibling = client.enqueue("limited_api", {"limited_times": 0}, concurrency_key="acme")
        other = client.enqueue("limited_api", {"limited_times": 0}, concurrency_key="globex")
        wait_until(lambda: {limited, sibling, other} <= ended(ledger), timeout=30, message="jobs never ran")
        job = client.get_job(limited)
    lines = read_ledger(ledger)
    raised = next(e["t"] for e in lines if e["event"] == "rate_limited")
    runs = [e for e in lines if e["job"] == limited and e["event"] == "start"]
    assert [e["attempt"] for e in runs] == [1, 1], "the rate-limited attempt was charged"
    assert runs[1]["t"] - raised >= 0.95
    assert (job.attempts, job.failures, job.rate_limited, job.status) == (1, 0, 1, "succeeded")
    sibling_start = next(e["t"] for e in lines if e["job"] == sibling and e["event"] == "start")
    other_start = next(e["t"] for e in lines if e["job"] == other and e["event"] == "start")
    assert sibling_start - raised >= 0.95, "a sibling of the held key started before the hold ended"
    assert other_start - raised < 0.9, "another key waited for the hold"


@POSTGRES
@pytest.mark.timeout(120)
def test_a_key_limit_holds_through_a_redis_data_loss(dispatcher, redis_url, db_url, start_worker, ledger):
    """An ordering key (limit 1): its first job runs 4 s, and Redis loses everything meanwhile. The
    restore rebuilds the key's running count from the job's row (leased until its deadline), so its
    sibling waits for that lease to end rather than starting beside the run still going."""
    import psycopg

    with Client(dispatcher.target) as client:
        client.set_queue_settings("sleep_ordered", key_concurrency=1)
        start_worker(dispatcher.target, types="sleep_ordered", concurrency=8)
        first = client.enqueue(
            "sleep_ordered", {"sleep": 4.0, "sleep_attempts": 1}, concurrency_key="acct", lease_ttl=8
        )
        second = client.enqueue("sleep_ordered", {"sleep": 0.1}, concurrency_key="acct")

        def leased_in_the_db() -> bool:
            with psycopg.connect(db_url) as conn:
                row = conn.execute("SELECT status, lease_until FROM jobs WHERE id = %s", (first,)).fetchone()
            return row is not None and row[0] == "leased" and row[1] is not None

        wait_until(leased_in_the_db, timeout=30, message="the first job's lease never reached the DB")
        r = redis.Redis.from_url(redis_url)
        try:
            r.flushall()
        finally:
            r.close()

        def all_ran_and_ended() -> bool:
            lines = read_ledger(ledger)
            starts = sum(1 for e in lines if e["event"] == "start")
            return {first, second} <= ended(ledger) and starts == sum(1 for e in lines if e["event"] == "end")

        wait_until(all_ran_and_ended, timeout=90, message="the jobs never both ran to their end")
    runs = [run for run in executions(ledger) if run[2]["key"] == "acct"]
    assert most_at_once(runs) == 1, sorted((round(s, 2), round(e, 2), run["job"]) for s, e, run in runs)
