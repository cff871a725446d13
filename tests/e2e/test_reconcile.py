"""A large reconcile after Redis lost its data: ownership and the API go on while it runs."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
import redis

from dispatcher.ids import new_job_ids
from dispatcher.keys import ALIVE_KEY, ShardKeys
from dispatcher.states import Priority
from dispatcher.store.base import NEW_JOB_COLUMNS
from shardmap import shard_for
from tests.support.db import query
from tests.support.processes import DispatcherProcess, WorkerProcess, read_ledger
from tests.support.shard_map import settled_view
from tests.support.wait import wait_until
from worker_sdk import Client

# Membership and ownership leases short enough that a reconcile holding up the coordinator's tick
# lets them lapse within the first seconds of the reconcile.
OWNERSHIP_TTL_MS = 2000
# After the data loss each member has this long to register again (its next tick, 0.4 s).
REJOIN_GRACE_S = 2.0
PROBE_DEADLINE_S = 1.0


def copy_ready_jobs(db_url: str, job_type: str, shard: int, count: int) -> None:
    """``count`` ready rows of one type, as enqueues committed before Redis lost its data leave them."""
    now = int(time.time() * 1000)
    with psycopg.connect(db_url) as conn, conn.cursor() as cur:
        with cur.copy(f"COPY jobs ({NEW_JOB_COLUMNS}) FROM STDIN") as copy:
            for job_id in new_job_ids(count):
                copy.write_row(
                    (job_id, job_type, shard, int(Priority.DEFAULT), b"{}", "ready", now, 3, 120_000, None)
                    + (now, now)
                )
        conn.commit()


@dataclass
class Watch:
    """What a thread saw of the cluster every few hundred ms from the data loss on: the shards'
    (owner, epoch) in Redis, which members were alive, and how long API calls on the reconciling
    process took."""

    redis_url: str
    target: str
    probe_type: str
    members: set[str]
    lost_at: float
    owners: dict[int, list[tuple[str, int]]] = field(default_factory=dict)
    lapses: list[str] = field(default_factory=list)
    slow_calls: list[str] = field(default_factory=list)
    probes: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, shard_count: int) -> None:
        client = redis.Redis.from_url(self.redis_url)
        api = Client(self.target, timeout=PROBE_DEADLINE_S)
        try:
            while not self.stop.is_set():
                self._look(client, shard_count)
                self._probe(api)
                self.stop.wait(0.2)
        finally:
            api.close()
            client.close()

    def _look(self, client: redis.Redis, shard_count: int) -> None:
        for shard in range(shard_count):
            owner, epoch = client.hmget(ShardKeys(shard).meta, "owner", "epoch")
            if epoch is None:
                continue
            seen = self.owners.setdefault(shard, [])
            current = (owner.decode(), int(epoch))
            if not seen or seen[-1] != current:
                seen.append(current)
        if time.monotonic() - self.lost_at < REJOIN_GRACE_S:
            return
        now_ms = time.time() * 1000
        alive = {m.decode() for m, until in client.zrange(ALIVE_KEY, 0, -1, withscores=True) if until > now_ms}
        if self.members - alive:
            self.lapses.append(f"{time.monotonic() - self.lost_at:.1f}s: {sorted(self.members - alive)} lapsed")

    def _probe(self, api: Client) -> None:
        """Enqueue, cancel (which waits for its status write) and read one job back."""
        started = time.monotonic()
        step = "enqueue"
        try:
            job_id = api.enqueue(self.probe_type, {}, delay=3600)
            step = "cancel"
            assert api.cancel(job_id) == "cancelled"
            step = "get"
            assert api.get_job(job_id).status == "cancelled"
        except Exception as exc:
            self.slow_calls.append(f"{started - self.lost_at:.1f}s: {step} failed: {exc!r:.200}")
            return
        self.probes += 1
        took = time.monotonic() - started
        if took > 3 * PROBE_DEADLINE_S:
            self.slow_calls.append(f"{started - self.lost_at:.1f}s: probe took {took:.1f}s")


def reconcile_after_data_loss(
    rows: int,
    start_dispatcher: Callable[..., DispatcherProcess],
    start_worker: Callable[..., WorkerProcess],
    ledger: Path,
    redis_url: str,
    db_url: str,
    drain_timeout: float,
) -> None:
    settings = {"ownership_ttl_ms": OWNERSHIP_TTL_MS}
    d1 = start_dispatcher(redis_url, db_url, dispatcher_id="d1", **settings)
    start_dispatcher(redis_url, db_url, dispatcher_id="d2", **settings)
    view = wait_until(lambda: settled_view(d1.target, 2), timeout=30)
    shard_count = view.shard_count
    owner = {s.shard: s.owner for s in view.shards}
    mine = [t for t in (f"noop.bulk{i}" for i in range(200)) if owner[shard_for(t, shard_count)] == "d1"]
    bulk_type = mine[0]
    bulk_shard = shard_for(bulk_type, shard_count)
    probe_type = next(t for t in mine if shard_for(t, shard_count) != bulk_shard)
    copy_ready_jobs(db_url, bulk_type, bulk_shard, rows)

    redis.Redis.from_url(redis_url).flushall()
    watch = Watch(redis_url, d1.target, probe_type, {"d1", "d2"}, time.monotonic())
    watcher = threading.Thread(target=watch.run, args=(shard_count,), daemon=True)
    watcher.start()
    try:
        start_worker(d1.target, types=bulk_type, concurrency=256)
        succeeded = "SELECT COUNT(*) FROM jobs WHERE type = ? AND status = 'succeeded'"
        wait_until(
            lambda: watch.lapses or watch.slow_calls or query(db_url, succeeded, (bulk_type,))[0][0] == rows,
            timeout=drain_timeout,
            interval=0.5,
        )
    finally:
        watch.stop.set()
        watcher.join(10)
    assert not watch.lapses, f"membership lapsed during the reconcile: {watch.lapses[:5]}"
    assert not watch.slow_calls, f"API calls on the reconciling process stalled: {watch.slow_calls[:5]}"
    # Each shard was taken back once, by the member that held it before the data loss.
    churn = {s: seen for s, seen in watch.owners.items() if len(seen) != 1 or seen[0][0] != owner[s]}
    assert not churn, f"shards changed hands or epochs after the data loss: {churn}"
    assert len(watch.owners) == shard_count
    assert watch.probes > 0
    runs = Counter(e["job"] for e in read_ledger(ledger) if e["event"] == "start")
    assert len(runs) == rows and set(runs.values()) == {1}, Counter(runs.values())


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_large_reconcile_lets_ownership_and_the_api_go_on(
    start_dispatcher: Callable[..., DispatcherProcess],
    start_worker: Callable[..., WorkerProcess],
    ledger: Path,
    redis_url: str,
    db_url: str,
) -> None:
    """Redis loses everything while 100,000 ready rows of one type wait in the DB: the shard's owner
    restores them (a reconcile lasting many ownership TTLs) while renewing its membership and leases
    and answering enqueue, cancel and get within a second; every job runs once."""
    reconcile_after_data_loss(
        100_000, start_dispatcher, start_worker, ledger, redis_url, db_url, drain_timeout=90
    )


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_reconcile_of_a_million_jobs_lets_ownership_and_the_api_go_on(
    start_dispatcher: Callable[..., DispatcherProcess],
    start_worker: Callable[..., WorkerProcess],
    ledger: Path,
    redis_url: str,
    db_url: str,
) -> None:
    reconcile_after_data_loss(
        1_000_000, start_dispatcher, start_worker, ledger, redis_url, db_url, drain_timeout=1500
    )

