"""Several dispatcher processes sharing the shards: supervisor, live rebalancing, takeover, fencing."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import psutil
import pytest

from shardmap import shard_for
from tests.support.processes import events, read_ledger
from tests.support.shard_map import settled_view
from tests.support.wait import wait_until
from worker_sdk import Client, ShardMap

SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
# A process frozen mid-write holds SQLite's one write lock and stalls every other process's writes
# (takeover included) until it continues: tests that freeze an owner run on PostgreSQL.
POSTGRES = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
SHARDS = 16
FAST = {"shard_count": SHARDS, "ownership_ttl_ms": 3000}


def _map(target: str) -> ShardMap:
    with Client(target, timeout=5) as client:
        return client.shard_map()


def _owners(target: str) -> Counter[str]:
    return Counter(s.owner for s in _map(target).shards)


def _runs(ledger: Path) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = defaultdict(list)
    for e in read_ledger(ledger):
        if e["event"] in ("start", "end"):
            runs[e["job"]].append(e)
    return runs


def _assert_no_overlapping_executions(ledger: Path) -> None:
    """Leases here never expire (long TTL, no worker dies), so two runs of one job at the same time
    would mean two valid leases."""
    spans: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    starts = {}
    for e in read_ledger(ledger):
        if e["event"] == "start":
            starts[(e["job"], e["token"])] = e["t"]
        elif e["event"] == "end":
            spans[e["job"]].append((starts[(e["job"], e["token"])], e["t"], e["token"]))
    for job, runs in spans.items():
        runs.sort()
        for (_, e1, t1), (s2, _, t2) in zip(runs, runs[1:], strict=False):
            assert s2 >= e1, f"job {job}: runs with tokens {t1} and {t2} overlapped"


@SQLITE
def test_a_different_shard_count_is_refused(start_dispatcher, redis_url, db_url):
    first = start_dispatcher(redis_url, db_url, shard_count=8)
    first.stop()
    with pytest.raises(RuntimeError, match="created with 8 shards"):
        start_dispatcher(redis_url, db_url, shard_count=16)


@SQLITE
def test_supervisor_restarts_a_killed_process_and_jobs_keep_flowing(
    start_dispatcher, redis_url, db_url, start_worker, ledger
):
    proc = start_dispatcher(redis_url, db_url, processes=3, **FAST)
    wait_until(
        lambda: settled_view(proc.target, 3), timeout=30, message="3 processes never owned every shard"
    )
    types = [f"noop{i}" for i in range(12)]
    for _ in range(2):
        start_worker(proc.target, types=",".join(types), concurrency=16)
    children = psutil.Process(proc.process.pid).children()
    assert len(children) == 3
    with Client(proc.target) as client:
        ids = client.enqueue_many([{"type": types[i % 12], "lease_ttl": 5} for i in range(3000)])
        children[1].kill()  # SIGKILL one dispatcher process while jobs flow
        wait_until(
            lambda: len({e["job"] for e in read_ledger(ledger) if e["event"] == "end"}) == 3000,
            timeout=90,
            message=lambda: f"{len({e['job'] for e in read_ledger(ledger)})} jobs ran",
        )
        more = client.enqueue_many([{"type": types[i % 12]} for i in range(300)])
    wait_until(
        lambda: settled_view(proc.target, 3), timeout=30, message="the killed process did not come back"
    )
    assert len(psutil.Process(proc.process.pid).children()) == 3
    ended = {e["job"] for e in read_ledger(ledger) if e["event"] == "end"}
    wait_until(
        lambda: set(more) <= {e["job"] for e in read_ledger(ledger) if e["event"] == "end"}, timeout=60
    )
    assert set(ids) <= ended
    # The supervisor passes SIGTERM on and every child exits.
    proc.signal(signal.SIGTERM)
    assert proc.process.wait(30) == 0
    assert not any(
        c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children if c.pid != children[1].pid
    )


@SQLITE
@pytest.mark.timeout(300)
def test_rebalance_live_under_load_loses_nothing(
    start_dispatcher, redis_url, db_url, start_worker, ledger, tmp_path
):
    procs = [start_dispatcher(redis_url, db_url, **FAST) for _ in range(4)]
    target = procs[0].target
    wait_until(lambda: settled_view(target, 4), timeout=30)
    with Client(target) as client:
        assert len(client.rebalance().moves) >= 0
        wait_until(lambda: sorted(_owners(target).values()) == [4, 4, 4, 4], timeout=20)
        types = [f"sleep{i}" for i in range(24)]
        for _ in range(2):
            start_worker(target, types=",".join(types), concurrency=32)
        jobs = [{"type": types[i % 24], "payload": {"sleep": 0.002}, "lease_ttl": 30} for i in range(20_000)]
        ids: list[str] = []
        for i in range(0, len(jobs), 2000):
            ids += client.enqueue_many(jobs[i : i + 2000])
        # 4 -> 2: two processes leave (they release their shards), the plan spreads them over two.
        procs[2].stop()
        procs[3].stop()
        wait_until(lambda: settled_view(target, 2), timeout=30)
        plan = client.rebalance(dry_run=True)
        assert not plan.applied
        client.rebalance()
        wait_until(lambda: sorted(_owners(target).values()) == [8, 8], timeout=20)
        # 2 -> 4 again, live.
        procs[2].start()
        procs[3].start()
        wait_until(lambda: settled_view(target, 4), timeout=30)
        moves = client.rebalance().moves
        assert len(moves) == 8, [(m.shard, m.source, m.target) for m in moves]
        wait_until(lambda: sorted(_owners(target).values()) == [4, 4, 4, 4], timeout=20)
        # And one dispatcher dies without a word: its shards are taken over after the ownership TTL.
        procs[1].kill()
        wait_until(lambda: settled_view(target, 3), timeout=30)
        wait_until(
            lambda: set(ids) <= {e["job"] for e in read_ledger(ledger) if e["event"] == "end"},
            timeout=240,
            message=lambda: f"{len(set(ids) - {e['job'] for e in read_ledger(ledger)})} missing",
        )
    runs = _runs(ledger)
    assert set(ids) <= set(runs)
    _assert_no_overlapping_executions(ledger)
    duplicates = sum(1 for j in ids if sum(1 for e in runs[j] if e["event"] == "start") > 1)
    # Only the SIGKILLed process can cause a re-run: acks it had received but not yet recorded.
    assert duplicates <= 500, duplicates


@POSTGRES
def test_paused_owner_is_fenced_after_takeover(start_dispatcher, redis_url, db_url, start_worker, ledger):
    first = start_dispatcher(redis_url, db_url, **FAST)
    second = start_dispatcher(redis_url, db_url, **FAST)
    wait_until(lambda: settled_view(first.target, 2), timeout=30)
    with Client(first.target) as client:
        client.rebalance()
        wait_until(lambda: sorted(_owners(first.target).values()) == [8, 8], timeout=20)
        paused_id = next(m.id for m in _map(second.target).members if m.address == second.target)
        before = {s.shard: s.epoch for s in _map(first.target).shards if s.owner == paused_id}
        start_worker(first.target, types=",".join(f"noop{i}" for i in range(16)), concurrency=16)
        second.signal(signal.SIGSTOP)  # a stand-in for a partition: it cannot renew, but it is not dead
        try:
            wait_until(
                lambda: settled_view(first.target, 1),
                timeout=30,
                message="the paused owner's shards were not taken over",
            )
            after = {s.shard: s.epoch for s in _map(first.target).shards}
            assert all(after[s] > e for s, e in before.items()), "takeover without a higher epoch"
            ids = client.enqueue_many([{"type": f"noop{i % 16}"} for i in range(800)])
        finally:
            second.signal(signal.SIGCONT)
        # Back, its scripts run with stale epochs: they are refused and it gives the shards up.
        wait_until(lambda: "shard taken over by another owner" in second.log_tail(400), timeout=20)
        wait_until(
            lambda: set(ids) <= {e["job"] for e in read_ledger(ledger) if e["event"] == "end"}, timeout=60
        )
        starts = Counter(e["job"] for e in read_ledger(ledger) if e["event"] == "start")
        assert all(starts[j] == 1 for j in ids), "a job ran twice across the takeover"
        wait_until(lambda: settled_view(first.target, 2), timeout=30)  # it rejoins as a member


@SQLITE
def test_only_the_owner_runs_scripts_on_a_shard(start_dispatcher, redis_url, db_url, start_worker, ledger):
    """Shard ownership removes contention: watch every script Redis runs (MONITOR) and check that each
    shard's keys are touched by one dispatcher only. The one script any process may run on another's
    shard is the note of committed jobs whose hand-off failed (a view gone stale across the
    rebalance): it is written for the owner's reconcile to read."""
    import hashlib

    import redis as redis_sync

    from dispatcher.queue.scripting import script_source

    anyone_may_run = hashlib.sha1(script_source("note_unpushed").encode()).hexdigest()

    procs = [start_dispatcher(redis_url, db_url, **FAST) for _ in range(2)]
    wait_until(lambda: settled_view(procs[0].target, 2), timeout=30)
    with Client(procs[0].target) as client:
        client.rebalance()
        wait_until(lambda: sorted(_owners(procs[0].target).values()) == [8, 8], timeout=20)
        types = [f"noop{i}" for i in range(16)]
        start_worker(procs[0].target, types=",".join(types), concurrency=16)
        owners = {s.shard: s.owner for s in _map(procs[0].target).shards}
        admin = redis_sync.Redis.from_url(redis_url)
        names = {}
        seen: dict[int, set[str]] = defaultdict(set)
        scripts = 0
        with admin.monitor() as monitor:
            # Enqueue through both dispatchers: each hands other owners' jobs over instead of queueing them.
            for proc in procs:
                with Client(proc.target) as c:
                    c.enqueue_many([{"type": types[i % 16]} for i in range(400)])
            deadline = time.monotonic() + 10
            for command in monitor.listen():
                text = command["command"]
                if text.startswith("EVALSHA") and "{s" in text and anyone_may_run not in text:
                    shard = int(text.split("{s", 1)[1].split("}", 1)[0])
                    seen[shard].add(f"{command['client_address']}:{command['client_port']}")
                    scripts += 1
                if scripts >= 400 or time.monotonic() > deadline:
                    break
        for client_info in admin.client_list():
            names[client_info["addr"]] = client_info["name"]
        admin.close()
    assert scripts >= 100
    for shard, addresses in seen.items():
        runners = {names.get(a, a) for a in addresses}
        assert runners == {owners[shard]}, f"shard {shard} touched by {runners}, owned by {owners[shard]}"


@POSTGRES
def test_clients_send_each_job_to_its_shards_owner(start_dispatcher, redis_url, db_url):
    """With ``route=True`` and the process at the client's target frozen, jobs whose shards the
    other process owns are still enqueued by ``AsyncClient`` and by ``Client`` (from several
    threads): they go to their owner, not through the target. With the owner frozen, a client that
    does not route (the default, and dispatcherctl) still gets its job committed by the target. Once
    an owner is gone, routed jobs go through the target again (which commits them and flags the
    shard for whoever takes it over)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from shardmap import shard_for
    from worker_sdk import AsyncClient

    # Ownership outlives the owner's freeze below (each unrouted enqueue waits out a 5 s hand-off).
    ttl = 20_000
    procs = [start_dispatcher(redis_url, db_url, shard_count=SHARDS, ownership_ttl_ms=ttl) for _ in range(2)]
    wait_until(lambda: settled_view(procs[0].target, 2), timeout=30)
    with Client(procs[0].target) as client:
        client.rebalance()
    wait_until(lambda: sorted(_owners(procs[0].target).values()) == [8, 8], timeout=20)
    address_of = {s.shard: s.address for s in _map(procs[0].target).shards}
    theirs = [t for t in (f"t{i}" for i in range(200)) if address_of[shard_for(t, SHARDS)] == procs[1].target]
    assert len(theirs) >= 3

    async def enqueue_while_the_target_is_frozen() -> list[str]:
        async with AsyncClient(procs[0].target, timeout=10, route=True) as client:
            ids = [await client.enqueue(theirs[0])]  # reads the shard map
            procs[0].signal(signal.SIGSTOP)
            try:
                ids.append(await client.enqueue(theirs[1], {"one": 1}))
                ids += await asyncio.gather(*(client.enqueue(t) for t in theirs))  # one EnqueueMany
                ids += await client.enqueue_many([{"type": t} for t in theirs])
            finally:
                procs[0].signal(signal.SIGCONT)
            return ids

    ids = asyncio.run(enqueue_while_the_target_is_frozen())
    assert len(set(ids)) == 2 + 2 * len(theirs)
    with Client(procs[0].target, timeout=10, route=True) as client, ThreadPoolExecutor(4) as threads:
        sync_ids = [client.enqueue(theirs[0])]  # reads the shard map
        procs[0].signal(signal.SIGSTOP)
        try:
            sync_ids += threads.map(client.enqueue, theirs)
            sync_ids += client.enqueue_many([{"type": t} for t in theirs])
        finally:
            procs[0].signal(signal.SIGCONT)
    assert len(set(sync_ids)) == 1 + 2 * len(theirs)
    with Client(procs[1].target) as client:
        assert all(client.get_job(job_id).type in theirs for job_id in ids + sync_ids)

    # Not routed, a job goes to the target, which commits it even while the owner cannot take the
    # hand-off (dispatcherctl often reaches the cluster through a port-forward to one process).
    procs[1].signal(signal.SIGSTOP)
    try:
        with Client(procs[0].target, timeout=15) as client:
            unrouted_id = client.enqueue(theirs[2])
        cli = subprocess.run(
            [sys.executable, "-m", "dispatcher.cli.ctl", "--target", procs[0].target,
             "--timeout", "15", "enqueue", theirs[2]],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        procs[1].signal(signal.SIGCONT)
    assert cli.returncode == 0, cli.stderr
    with Client(procs[0].target) as client:
        assert client.get_job(unrouted_id).type == client.get_job(cli.stdout.strip()).type == theirs[2]

    procs[1].kill()  # its shards stay in the map until its ownership lapses (20 s)

    async def enqueue_after_the_owner_died() -> tuple[str, set[str]]:
        async with AsyncClient(procs[0].target, timeout=10, route=True) as client:
            job_id = await client.enqueue(theirs[0])
            return job_id, set(client._routes._avoid_until)  # type: ignore[union-attr]

    job_id, avoided = asyncio.run(enqueue_after_the_owner_died())
    assert avoided == {procs[1].target}  # the owner was tried, could not be reached...
    with Client(procs[0].target, timeout=10, route=True) as client:
        sync_id = client.enqueue(theirs[1])
        assert set(client._routes._avoid_until) == {procs[1].target}  # type: ignore[union-attr]
        assert client.get_job(job_id).type == theirs[0]  # ...and the target took the jobs
        assert client.get_job(sync_id).type == theirs[1]


@POSTGRES
def test_a_worker_whose_only_address_stops_finds_the_other_dispatchers(
    start_dispatcher, redis_url, db_url, start_worker, ledger
):
    """The worker's target is the owner of its type's shard, and that dispatcher dies for good
    (SIGKILL): the worker asks the other dispatchers of the last map for it, follows the shard to its
    next owner (after the ownership TTL), reclaims its leases there and runs the rest. It used to
    retry the dead address forever."""
    procs = [start_dispatcher(redis_url, db_url, **FAST) for _ in range(2)]
    wait_until(lambda: settled_view(procs[0].target, 2), timeout=30)
    with Client(procs[0].target) as client:
        client.rebalance()
        wait_until(lambda: sorted(_owners(procs[0].target).values()) == [8, 8], timeout=20)
        view = _map(procs[0].target)
        owner_id = next(s.owner for s in view.shards if s.shard == shard_for("sleep_route", SHARDS))
        owner_address = next(m.address for m in view.members if m.id == owner_id)
    owner = next(p for p in procs if p.target == owner_address)
    other = next(p for p in procs if p is not owner)
    start_worker(owner.target, types="sleep_route", concurrency=8)
    with Client(other.target) as client:
        ids = client.enqueue_many([{"type": "sleep_route", "payload": {"sleep": 0.05}} for _ in range(200)])
        wait_until(
            lambda: len({e["job"] for e in read_ledger(ledger) if e["event"] == "end"}) >= 40, timeout=30
        )
        owner.kill()
        stopped = time.monotonic()
        wait_until(
            lambda: set(ids) <= {e["job"] for e in read_ledger(ledger) if e["event"] == "end"},
            timeout=45,
            message=lambda: f"{len(set(ids) - {e['job'] for e in read_ledger(ledger)})} jobs never ran",
        )
    assert time.monotonic() - stopped < 30, "the jobs waited for their leases to lapse"


@POSTGRES
def test_routing_clients_close_channels_to_owners_gone_from_the_map(start_dispatcher, redis_url, db_url):
    """A routing client keeps a channel per owner address it sent jobs to. Dispatchers come back at
    new addresses (a pod's IP changes with each restart), so an address the shard map no longer names
    is closed once calls sent there are past their deadline: a long-lived producer held one channel
    per dispatcher address it ever used, the whole life of the process."""
    import asyncio

    from worker_sdk import AsyncClient

    procs = [start_dispatcher(redis_url, db_url, **FAST) for _ in range(2)]
    wait_until(lambda: settled_view(procs[0].target, 2), timeout=30)
    with Client(procs[0].target) as client:
        client.rebalance()
    wait_until(lambda: sorted(_owners(procs[0].target).values()) == [8, 8], timeout=20)
    address_of = {s.shard: s.address for s in _map(procs[0].target).shards}
    theirs = [t for t in (f"t{i}" for i in range(200)) if address_of[shard_for(t, SHARDS)] == procs[1].target]
    gone = procs[1].target

    def reread_and_enqueue(client: Client) -> bool:
        client._routes._read_at = -float("inf")  # type: ignore[union-attr]  # the map's 10 s refresh, now
        client.enqueue(theirs[0])
        return gone not in client._owner_stubs

    async def routed_async() -> bool:
        async with AsyncClient(procs[0].target, timeout=2, route=True) as client:
            await client.enqueue(theirs[0])
            assert gone in client._owner_stubs
            procs[1].kill()
            wait_until(lambda: settled_view(procs[0].target, 1), timeout=30)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                client._routes._read_at = -float("inf")  # type: ignore[union-attr]
                await client.enqueue(theirs[0])
                await asyncio.sleep(0.3)
                if gone not in client._owner_stubs:
                    return True
            return False

    with Client(procs[0].target, timeout=2, route=True) as client:
        client.enqueue(theirs[0])
        assert gone in client._owner_stubs
        assert asyncio.run(routed_async()), "AsyncClient kept its channel to the dead owner"
        wait_until(lambda: reread_and_enqueue(client), timeout=15, interval=0.3)
        assert client._owner_channel_of.keys() == client._owner_stubs.keys()
        assert client.get_job(client.enqueue(theirs[1])).type == theirs[1]


def test_memberships_that_lapsed_an_hour_ago_are_forgotten(start_dispatcher, redis_url, db_url):
    """A member id is per process (host and port), so every dispatcher that ever died left its id and
    address in Redis, and every shard map (to every worker and client, at each refresh) listed them
    all. One lapsed over an hour ago is forgotten; one lapsed a minute ago is still shown, as dead;
    one that stops cleanly takes its id with it."""
    import redis as redis_sync

    from dispatcher.queue.keys import ALIVE_KEY, MEMBERS_KEY

    admin = redis_sync.Redis.from_url(redis_url, decode_responses=True)
    seconds, micros = admin.time()
    now_ms = seconds * 1000 + micros // 1000
    admin.hset(MEMBERS_KEY, mapping={"died-long-ago": "10.0.0.1:7070", "died-recently": "10.0.0.2:7070"})
    admin.zadd(ALIVE_KEY, {"died-long-ago": now_ms - 2 * 3_600_000, "died-recently": now_ms - 60_000})
    procs = [start_dispatcher(redis_url, db_url, **FAST) for _ in range(2)]
    wait_until(lambda: settled_view(procs[0].target, 2), timeout=30)
    wait_until(lambda: admin.hget(MEMBERS_KEY, "died-long-ago") is None, timeout=10)
    assert admin.zscore(ALIVE_KEY, "died-long-ago") is None
    shown = {m.id: m.alive for m in _map(procs[0].target).members}
    assert "died-long-ago" not in shown and shown["died-recently"] is False
    leaving = next(m.id for m in _map(procs[0].target).members if m.address == procs[1].target)
    procs[1].stop()
    assert admin.hget(MEMBERS_KEY, leaving) is None
    admin.close()


@POSTGRES
def test_a_worker_whose_other_dispatcher_left_the_map_for_a_while_still_gets_leases(
    start_dispatcher, redis_url, db_url, start_worker, ledger
):
    """A worker splits its concurrency over its links, and a link's share grows while another
    dispatcher is out of the map (its membership lapsed, say a process starved of CPU during a burst,
    its shards still its own). The dispatcher holds a stream to the concurrency declared in its
    hello, so credit granted past it was dropped there and counted as granted here: once the other
    dispatcher was back and the share shrank again, the link's phantom credit stopped every further
    grant, and the link's jobs waited with the worker idle (seen in the soak: 5 of 8 job types
    stalled for good)."""
    import redis as redis_sync

    from dispatcher.queue.keys import ALIVE_KEY

    procs = [start_dispatcher(redis_url, db_url, **FAST) for _ in range(2)]
    wait_until(lambda: settled_view(procs[0].target, 2), timeout=30)
    with Client(procs[0].target) as client:
        client.rebalance()
    wait_until(lambda: sorted(_owners(procs[0].target).values()) == [8, 8], timeout=20)
    view = _map(procs[0].target)
    address_of = {s.shard: s.address for s in view.shards}
    lapsing = next(m.id for m in view.members if m.address == procs[1].target)
    names = [f"noop{i}" for i in range(200)]
    kept = next(t for t in names if address_of[shard_for(t, SHARDS)] == procs[0].target)
    other = next(t for t in names if address_of[shard_for(t, SHARDS)] == procs[1].target)
    start_worker(procs[0].target, types=f"{kept},{other}", concurrency=8)
    with Client(procs[0].target) as client:
        client.enqueue_many([{"type": t} for t in (kept, other) for _ in range(4)])
    wait_until(lambda: len(list(events(ledger, "start"))) >= 8, timeout=30)

    # The other process's membership looks lapsed for longer than the worker's map refresh (5 s),
    # while it keeps renewing its shards: the map names no address for them, and the worker's one
    # link left may use all 8 slots.
    admin = redis_sync.Redis.from_url(redis_url)
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        admin.zadd(ALIVE_KEY, {lapsing: 1})
        time.sleep(0.02)
    admin.close()
    wait_until(lambda: settled_view(procs[0].target, 2), timeout=30)
    time.sleep(6)  # the worker sees both again: two links of 4 slots

    with Client(procs[0].target) as client:
        client.enqueue_many([{"type": kept} for _ in range(40)])
    wait_until(
        lambda: sum(1 for e in events(ledger, "start") if e["type"] == kept) >= 44,
        timeout=30,
        message=lambda: (
            f"{sum(1 for e in events(ledger, 'start') if e['type'] == kept)} of 44 {kept} jobs ran"
        ),
    )
