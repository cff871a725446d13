"""The working set on a real 3-master Redis Cluster gives the same results as on one Redis server.

One scenario (every WorkingSet call, on a synthetic clock) runs against the session redis-server and
the session Redis Cluster, for shards whose ``{sN}`` hash tags land on three different masters; the
transcripts must be equal, and the keys of each shard must sit on the master that owns its slot.
Also: the scripts route by their keys' slot (keys of two slots are refused client-side), NOSCRIPT
reloads on the cluster, and an unreachable server, cluster or master raises a ``redis_errors.REDIS_DOWN``
error within about a second.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot
from redis.exceptions import RedisClusterException

from dispatcher.config import RetryPolicy
from dispatcher.ops.redis_client import ClusterUnavailable, ShardqRedisCluster, connect
from dispatcher.ops.redis_errors import REDIS_DOWN
from dispatcher.queue.keys import CLUSTER_KEY, ShardKeys
from dispatcher.queue.records import JobRecord
from dispatcher.queue.states import JobState, Priority
from dispatcher.queue.working_set import NackSpec, NewJob, Restored, WorkingSet
from shardq_common.errors import NotOwner
from tests.support.ports import free_port
from tests.support.redis_cluster import RedisCluster3
from tests.support.wait import wait_for

T0 = 1_700_000_000_000  # the synthetic clock (ms)
TTL = 5_000
POLICY = RetryPolicy(base_ms=100, cap_ms=10_000, jitter=0.0)


def shards_on_distinct_masters(cluster: RedisCluster3, count: int = 3) -> list[int]:
    """The first shard number whose keys land on each master, ``count`` masters in all."""
    owners = cluster.slot_owners()
    picked: dict[int, int] = {}
    for shard in range(1000):
        port = owners[key_slot(ShardKeys(shard).meta.encode())]
        picked.setdefault(port, shard)
        if len(picked) == count:
            return sorted(picked.values())
    raise AssertionError(f"shards 0..999 do not cover {count} masters: {picked}")


def job(job_id: str, job_type: str, prio: Priority, run_at: int, *, idem: str = "") -> NewJob:
    record = JobRecord(
        type=job_type,
        priority=prio,
        state=JobState.DELAYED,
        run_at_ms=run_at,
        enqueued_at_ms=T0,
        max_attempts=5,
        lease_ttl_ms=TTL,
        idempotency_key=idem,
    )
    return NewJob(job_id, record, f"payload-{job_id}".encode())


async def acquire(ws: WorkingSet, shard: int, epoch: int, owner: str, now: int) -> int:
    """``WorkingSet.acquire`` with an ownership lease until ``now`` + 60 s."""
    return await ws.acquire(shard, epoch, owner, now, now + 60_000)


async def expect_not_owner(call: Any) -> str:
    with pytest.raises(NotOwner):
        await call
    return "NotOwner"


async def scenario(ws: WorkingSet, shard: int) -> list[tuple[str, Any]]:
    """Every WorkingSet call on one shard; returns what each call gave, in order."""
    out: list[tuple[str, Any]] = []

    def note(label: str, value: Any) -> None:
        out.append((label, value))

    s = f"s{shard}"
    note("acquire new", await acquire(ws, shard, 7, "owner-a", T0))
    note("acquire stale", await expect_not_owner(acquire(ws, shard, 7, "owner-b", T0)))
    note("acquire newer", await acquire(ws, shard, 8, "owner-a", T0))
    epoch = 8

    ready = [
        job(f"{s}-r{i}", ("ta", "tb")[i % 2], Priority(i % 3), T0 - 10 + i, idem=f"k{i}" if i == 0 else "")
        for i in range(6)
    ]
    delayed = [
        job(f"{s}-d0", "ta", Priority.HIGH, T0 + 1_000),
        job(f"{s}-d1", "tb", Priority.LOW, T0 + 2_000),
    ]
    note("enqueue", await ws.enqueue(shard, epoch, T0, ready + delayed))
    note("enqueue again", await ws.enqueue(shard, epoch, T0, ready[:1]))
    note("enqueue stale epoch", await expect_not_owner(ws.enqueue(shard, 7, T0, ready[:1])))
    note("oldest ready ta/high", await ws.oldest_ready(shard, "ta", Priority.HIGH))
    note("oldest ready tb/low", await ws.oldest_ready(shard, "tb", Priority.LOW))
    note("oldest ready empty", await ws.oldest_ready(shard, "tc", Priority.HIGH))
    note("next due", await ws.next_due(shard))
    note("promote nothing due", await ws.promote_due(shard, epoch, T0 + 500, 10))
    note("promote one", await ws.promote_due(shard, epoch, T0 + 1_500, 10))
    note("promote stale", await expect_not_owner(ws.promote_due(shard, 7, T0 + 1_500, 10)))
    note("counts after promote", await ws.counts([shard]))

    now = T0 + 1_500
    leased = await ws.lease(shard, epoch, now, ["ta", "tb"], [0, 1, 2, 1, 0], nonce="n")
    grants, unfilled = leased.grants, leased.unfilled
    note("lease", (grants, unfilled))
    note("lease stale", await expect_not_owner(ws.lease(shard, 7, now, ["ta"], [0])))
    leased = await ws.lease(shard, epoch, now, ["ta", "tb"], [2, 2, 2], fallback=False, nonce="n")
    more, left = leased.grants, leased.unfilled
    note("lease no fallback", (more, left))
    refs = [(g.id, g.token) for g in grants]
    note("extend", await ws.extend(shard, now + 100, [*refs[:2], (f"{s}-ghost", "8:1")]))

    note("ack", await ws.ack(shard, now + 200, refs[:1]))
    note("ack again (stale token)", await ws.ack(shard, now + 200, refs[:1]))
    nacks = [NackSpec(*refs[1]), NackSpec(*refs[2], final_reason="not_retryable")]
    note("retry", await ws.retry(shard, now + 200, nacks, POLICY))
    note("shorten", await ws.shorten(shard, now + 300, "", refs[3:4]))
    note("reap before deadline", await ws.reap(shard, epoch, now + 299, 10, POLICY))
    note("reap", await ws.reap(shard, epoch, now + 300, 10, POLICY))
    note("reap stale", await expect_not_owner(ws.reap(shard, 7, now + 300, 10, POLICY)))

    running = grants[4]
    note("cancel running", await ws.cancel(shard, running.id, running.type, running.priority, now + 400))
    note("extend cancelled", await ws.extend(shard, now + 400, [refs[4]]))
    # delayed[0] was promoted above
    note("cancel ready", await ws.cancel(shard, delayed[0].id, "ta", Priority.HIGH, now + 400))
    note("cancel delayed", await ws.cancel(shard, delayed[1].id, "tb", Priority.LOW, now + 400))
    note("cancel succeeded", await ws.cancel(shard, refs[0][0], "ta", Priority.HIGH, now + 400))
    note("cancel unknown", await ws.cancel(shard, f"{s}-ghost", "ta", Priority.HIGH, now + 400))

    dead_id = refs[2][0]
    note("record dead", await ws.record(shard, dead_id))
    new_restored = job(f"{s}-restored", "tc", Priority.DEFAULT, T0 + 3_000)
    note("restore", await ws.restore(shard, epoch, "restore", [ready[0], new_restored]))
    dead_job = next(j for j in ready + delayed if j.id == dead_id)
    note("requeue dead", await ws.restore(shard, epoch, "requeue", [dead_job]))
    note("restore stale", await expect_not_owner(ws.restore(shard, 7, "restore", [new_restored])))
    note("record requeued", await ws.record(shard, dead_id))

    all_ids = [j.id for j in ready + delayed] + [new_restored.id]
    note("note unpushed", await ws.note_unpushed(shard, [f"{s}-ghost", f"{s}-unpushed"], now + 500))
    note("missing", await ws.missing(shard, [*all_ids, f"{s}-ghost", f"{s}-unpushed"]))
    unpushed = job(f"{s}-unpushed", "tc", Priority.DEFAULT, T0 + 3_000)
    note("restore unpushed", await ws.restore(shard, epoch, "restore", [unpushed, new_restored]))
    note("missing after restore", await ws.missing(shard, [f"{s}-ghost", f"{s}-unpushed"]))
    note("forget", await ws.forget(shard, [*all_ids, unpushed.id]))
    note("missing after forget", await ws.missing(shard, all_ids))
    note("next due at end", await ws.next_due(shard))
    note("counts at end", await ws.counts([shard]))
    note("record unknown", await ws.record(shard, f"{s}-ghost"))
    return out


@pytest.fixture
async def single_ws(redis_url: str) -> AsyncIterator[WorkingSet]:
    client = connect(redis_url)
    yield WorkingSet(client)
    await client.aclose()


@pytest.fixture
async def cluster_ws(redis_cluster_url: str) -> AsyncIterator[WorkingSet]:
    client = connect(redis_cluster_url)
    assert isinstance(client, ShardqRedisCluster)
    yield WorkingSet(client)
    await client.aclose()


async def test_every_transition_matches_single_redis(single_ws, cluster_ws, redis_cluster) -> None:
    shards = shards_on_distinct_masters(redis_cluster)
    owners = {redis_cluster.port_for_key(ShardKeys(s).meta) for s in shards}
    assert len(owners) == 3, "the scenario must touch all three masters"
    for shard in shards:
        expected = await scenario(single_ws, shard)
        got = await scenario(cluster_ws, shard)
        assert [label for label, _ in got] == [label for label, _ in expected]
        for (label, want), (_, have) in zip(expected, got, strict=True):
            assert have == want, f"shard {shard}, {label}: cluster {have!r} != single Redis {want!r}"

    # A few results spelled out, so the equality above is not between two equally wrong runs.
    by_label = dict(got)
    s = f"s{shards[-1]}"
    assert by_label["acquire new"] == 1 and by_label["acquire newer"] == 0
    assert by_label["enqueue"] == [1, 1, 1, 1, 1, 1, 2, 2]
    assert by_label["enqueue again"] == [0]
    assert by_label["promote one"] == (1, T0 + 2_000)
    grants, unfilled = by_label["lease"]
    assert len(grants) == 5 and unfilled == []
    assert [g.priority for g in grants[:3]] == [Priority.HIGH, Priority.DEFAULT, Priority.LOW]
    assert by_label["ack"][0].state is JobState.SUCCEEDED
    assert by_label["ack again (stale token)"] == [None]
    assert [t.state for t in by_label["retry"]] == [JobState.DELAYED, JobState.DEAD]
    assert by_label["retry"][0].run_at_ms == T0 + 1_500 + 200 + POLICY.base_ms
    transitions, _ = by_label["reap"]
    assert [t.id for t in transitions] == [grants[3].id]
    assert len(by_label["lease no fallback"][0]) == 1 and by_label["lease no fallback"][1] == [2, 2]
    assert by_label["cancel running"].code == 2
    assert by_label["cancel ready"].code == 1 and by_label["cancel delayed"].code == 1
    assert by_label["forget"] == 3  # succeeded r0, cancelled d0 and d1
    assert by_label["extend cancelled"][0] < 0
    assert by_label["cancel succeeded"].code == 3 and by_label["cancel unknown"].code == 0
    assert by_label["restore"] == Restored(lost=1) and by_label["requeue dead"] == Restored(lost=1)
    assert by_label["record requeued"].state is JobState.DELAYED
    assert by_label["missing"] == {f"{s}-ghost": True, f"{s}-unpushed": True}
    assert by_label["restore unpushed"] == Restored(unpushed=1)
    # The restored job's note went; the ghost's stays (no restore looked at it).
    assert by_label["missing after restore"] == {f"{s}-ghost": True}

    # Each shard's keys are on the master that owns its slot, and on no other.
    for shard in shards:
        k = ShardKeys(shard)
        slot = key_slot(k.jobs.encode())
        home = redis_cluster.port_for_key(k.jobs)
        for node in redis_cluster.nodes:
            with node.client() as client:
                in_slot = int(client.execute_command("CLUSTER COUNTKEYSINSLOT", slot))
                if node.port == home:
                    assert client.exists(k.jobs, k.meta, k.counts) == 3
                    assert in_slot >= 3
                else:
                    assert in_slot == 0, (shard, node.port, home)


async def test_counts_over_many_shards_in_one_pipeline(single_ws, cluster_ws, redis_cluster) -> None:
    shards = list(range(48))
    homes = {redis_cluster.port_for_key(ShardKeys(s).counts) for s in shards}
    assert len(homes) == 3
    results = []
    for ws in (single_ws, cluster_ws):
        for shard in shards:
            await acquire(ws, shard, 1, "owner", T0)
            jobs = [
                job(f"c{shard}-{i}", f"t{i % 3}", Priority(i % 3), T0 + (0 if i % 4 else 5_000))
                for i in range(shard % 5 + 1)
            ]
            await ws.enqueue(shard, 1, T0, jobs)
        await ws.lease(shards[-1], 1, T0, ["t0", "t1", "t2"], [0])
        results.append(await ws.counts(shards))
        assert await ws.counts([]) == {}
    single, cluster = results
    assert cluster == single
    total = sum(shard % 5 + 1 for shard in shards)
    assert sum(cluster.values()) == total
    assert sum(v for (_, _, state), v in cluster.items() if state == "leased") == 1
    assert cluster[("t0", 0, "delayed")] == sum(
        1 for s in shards for i in range(s % 5 + 1) if i % 4 == 0 and i % 3 == 0
    )


async def test_cluster_key_and_plain_commands(cluster_ws) -> None:
    redis_client = cluster_ws.redis
    assert await redis_client.hsetnx(CLUSTER_KEY, "shard_count", 8) == 1
    assert await redis_client.hsetnx(CLUSTER_KEY, "shard_count", 16) == 0
    assert int(await redis_client.hget(CLUSTER_KEY, "shard_count")) == 8
    assert await redis_client.hgetall(CLUSTER_KEY) == {b"shard_count": b"8"}
    assert await redis_client.zrange(ShardKeys(3).delayed, 0, 0, withscores=True) == []


async def test_scripts_route_by_slot_and_reload_after_script_flush(cluster_ws, redis_cluster) -> None:
    a, b, c = shards_on_distinct_masters(redis_cluster)
    await acquire(cluster_ws, a, 1, "o", T0)
    await cluster_ws.enqueue(a, 1, T0, [job("x", "ta", Priority.HIGH, T0)])
    # Keys of two slots in one script: refused by the client before anything is sent.
    with pytest.raises(RedisClusterException, match="same key slot"):
        await cluster_ws.scripts.missing_jobs(keys=[ShardKeys(a).jobs, ShardKeys(b).jobs], args=["x"])
    # The script cache of every master emptied: EVALSHA gets NOSCRIPT and the script is sent again
    # (EVAL) to the one master that serves the keys, which caches it.
    for node in redis_cluster.nodes:
        with node.client() as client:
            client.script_flush()
    sha = cluster_ws.scripts.missing_jobs.sha

    def cached_on() -> set[int]:
        out = set()
        for node in redis_cluster.nodes:
            with node.client() as client:
                if client.script_exists(sha) == [True]:
                    out.add(node.port)
        return out

    assert await cluster_ws.missing(a, ["x", "y"]) == {"y": False}
    assert cached_on() == {redis_cluster.port_for_key(ShardKeys(a).jobs)}
    assert await cluster_ws.missing(a, ["x"]) == {}  # EVALSHA now
    assert await cluster_ws.missing(b, ["x"]) == {"x": False}
    assert await cluster_ws.missing(c, ["x"]) == {"x": False}
    assert cached_on() == set(redis_cluster.ports)


@pytest.mark.serial
@pytest.mark.parametrize("kind", ["single", "cluster"])
async def test_unreachable_redis_is_reported_within_a_second(kind: str) -> None:
    ports = [free_port() for _ in range(3)]
    url = (
        f"redis://127.0.0.1:{ports[0]}/0"
        if kind == "single"
        else "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports)
    )
    client = connect(url)
    ws = WorkingSet(client)
    try:
        started = time.monotonic()
        with pytest.raises(REDIS_DOWN):
            await acquire(ws, 0, 1, "o", T0)
        assert time.monotonic() - started < 1.5
        started = time.monotonic()
        with pytest.raises(REDIS_DOWN):
            await ws.counts([0, 1, 2])
        assert time.monotonic() - started < 1.5
    finally:
        await client.aclose()


async def test_a_dead_master_fails_only_its_shards_and_recovers(tmp_path: Path) -> None:
    cluster = RedisCluster3(tmp_path / "cluster")
    cluster.start()
    client = connect(cluster.url)
    ws = WorkingSet(client)
    try:
        shards = shards_on_distinct_masters(cluster)
        for shard in shards:
            assert await acquire(ws, shard, 1, "o", T0) == 1
            await ws.enqueue(shard, 1, T0, [job(f"j{shard}", "ta", Priority.HIGH, T0)])
        victim_shard, *others = shards
        victim = cluster.node(cluster.port_for_key(ShardKeys(victim_shard).meta))
        victim.kill()

        started = time.monotonic()
        with pytest.raises(REDIS_DOWN):
            await ws.lease(victim_shard, 1, T0, ["ta"], [0])
        assert time.monotonic() - started < 1.5
        for shard in others:  # the other masters still serve their shards
            grants = (await ws.lease(shard, 1, T0, ["ta"], [0])).grants
            assert [g.id for g in grants] == [f"j{shard}"]

        victim.start()  # same port and nodes-<port>.conf: it rejoins with its slots, but empty
        cluster.wait_ok()

        async def back() -> bool:
            try:
                return await acquire(ws, victim_shard, 2, "o", T0) == 1  # meta lost: "reconcile it"
            except REDIS_DOWN:
                return False

        assert await wait_for(back, timeout=10)
        assert await ws.missing(victim_shard, [f"j{victim_shard}"]) == {f"j{victim_shard}": False}
    finally:
        await client.aclose()
        cluster.stop()


def test_cluster_down_error_is_a_connection_error() -> None:
    assert issubclass(ClusterUnavailable, redis.ConnectionError)
    assert issubclass(ClusterUnavailable, REDIS_DOWN)
