"""A large reconcile after Redis lost its data: ownership and the API go on while it runs."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from dispatcher.queue.ids import new_job_ids
from dispatcher.queue.keys import ALIVE_KEY, ShardKeys
from dispatcher.queue.states import Priority
from dispatcher.store.base import NEW_JOB_COLUMNS
from shardmap import shard_for
from tests.support.db import query
from tests.support.processes import DispatcherProcess, WorkerProcess
from tests.support.shard_map import settled_view
from tests.support.wait import wait_until
from worker_sdk import Client

# Membership and ownership leases short enough that a reconcile holding up the coordinator's tick
# lets them lapse within the first seconds of the reconcile.
OWNERSHIP_TTL_MS = 2000
# After the data loss each member has this long to register again (its next tick, 0.4 s).
REJOIN_GRACE_S = 2.0
# A read answers within this; a call that waits for a status write (a cancel, reading a job whose
# lease is not written yet) may also wait for the write batch in flight, which takes up to half a
# second while a worker acks thousands of jobs a second on a busy machine.
READ_DEADLINE_S = 1.0
WRITE_DEADLINE_S = 2.0


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
    """What a thread saw of the cluster every 200 ms from the data loss on: each change of a shard's
    (owner, epoch) in Redis, when every shard was back with the member that held it before, which
    members let their membership lapse, and API calls on the reconciling process that failed."""

    redis_url: str
    target: str
    probe_type: str
    ledger: Path
    owners: dict[int, str]  # shard -> its owner before the data loss
    lost_at: float
    changes: list[tuple[float, int, str, int]] = field(default_factory=list)  # (s, shard, owner, epoch)
    settled_at: float | None = None  # s after the data loss
    lapses: list[str] = field(default_factory=list)
    failed_calls: list[str] = field(default_factory=list)
    probes: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        client = redis.Redis.from_url(self.redis_url)
        reads = Client(self.target, timeout=READ_DEADLINE_S)
        writes = Client(self.target, timeout=WRITE_DEADLINE_S)
        current: dict[int, tuple[str, int]] = {}
        try:
            while not self.stop.is_set():
                self._look(client, current)
                self._probe(reads, writes)
                self.stop.wait(0.2)
        finally:
            reads.close()
            writes.close()
            client.close()

    def _look(self, client: redis.Redis, current: dict[int, tuple[str, int]]) -> None:
        at = time.monotonic() - self.lost_at
        for shard in self.owners:
            owner, epoch = client.hmget(ShardKeys(shard).meta, "owner", "epoch")
            if epoch is not None and current.get(shard) != (owner.decode(), int(epoch)):
                current[shard] = (owner.decode(), int(epoch))
                self.changes.append((at, shard, *current[shard]))
        now_ms = time.time() * 1000
        alive = {
            m.decode() for m, until in client.zrange(ALIVE_KEY, 0, -1, withscores=True) if until > now_ms
        }
        members = set(self.owners.values())
        if at >= REJOIN_GRACE_S and members - alive:
            self.lapses.append(f"{at:.1f}s: {sorted(members - alive)} lapsed")
        back = all(current.get(shard, ("", 0))[0] == owner for shard, owner in self.owners.items())
        if self.settled_at is None and back and members <= alive:
            self.settled_at = at

    def _probe(self, reads: Client, writes: Client) -> None:
        """Enqueue, cancel and read back a job; read the job a worker started last."""
        started = time.monotonic()
        step = "enqueue"
        try:
            job_id = writes.enqueue(self.probe_type, {}, delay=3600)
            step = "cancel"
            assert writes.cancel(job_id) == "cancelled"
            step = "get"
            assert reads.get_job(job_id).status == "cancelled"
            step = "get a running job"
            running = last_started(self.ledger)
            if running:
                writes.get_job(running)
        except Exception as exc:
            self.failed_calls.append(f"{started - self.lost_at:.1f}s: {step} failed: {exc!r:.200}")
            return
        self.probes += 1


def last_started(ledger: Path) -> str | None:
    """The job of the ledger's last complete line (the ledger is long: only its end is read)."""
    if not ledger.exists():
        return None
    with ledger.open("rb") as f:
        f.seek(max(0, f.seek(0, 2) - 4096))
        lines = f.read().split(b"\n")[1:-1]  # the first may be cut, the last is not complete yet
    return str(json.loads(lines[-1])["job"]) if lines else None


def starts(ledger: Path) -> Counter[str]:
    """How many times each job started, read line by line (a million jobs make a long ledger)."""
    runs: Counter[str] = Counter()
    with ledger.open() as f:
        for line in f:
            event = json.loads(line)
            if event["event"] == "start":
                runs[event["job"]] += 1
    return runs


def logged(proc: DispatcherProcess, event: str) -> list[dict[str, Any]]:
    """The JSON log lines of ``event`` the process wrote."""
    lines = (
        line
        for path in proc.log_dir.glob(f"dispatcher-{proc.port}-*.log")
        for line in path.read_text().splitlines()
    )
    return [
        e for e in (json.loads(line) for line in lines if line.startswith("{")) if e.get("event") == event
    ]


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
    d2 = start_dispatcher(redis_url, db_url, dispatcher_id="d2", **settings)
    view = wait_until(lambda: settled_view(d1.target, 2), timeout=30)
    shard_count = view.shard_count
    owner = {s.shard: s.owner for s in view.shards}
    mine = [t for t in (f"noop.bulk{i}" for i in range(200)) if owner[shard_for(t, shard_count)] == "d1"]
    bulk_type = mine[0]
    bulk_shard = shard_for(bulk_type, shard_count)
    probe_type = next(t for t in mine if shard_for(t, shard_count) != bulk_shard)
    copy_ready_jobs(db_url, bulk_type, bulk_shard, rows)

    redis.Redis.from_url(redis_url).flushall()
    lost_at_wall = time.time()
    watch = Watch(redis_url, d1.target, probe_type, ledger, owner, time.monotonic())
    watcher = threading.Thread(target=watch.run, daemon=True)
    watcher.start()
    try:
        start_worker(d1.target, types=bulk_type, concurrency=256)
        # Until every shard is back with its owner: the first member to register again after the
        # data loss may take the other's shards for a tick (it sees itself alone), and hand them back.
        wait_until(
            lambda: watch.settled_at is not None, timeout=30, message=lambda: f"never settled: {watch}"
        )
        succeeded = "SELECT COUNT(*) FROM jobs WHERE type = ? AND status = 'succeeded'"
        wait_until(
            lambda: (
                watch.lapses or watch.failed_calls or query(db_url, succeeded, (bulk_type,))[0][0] == rows
            ),
            timeout=drain_timeout,
            interval=0.5,
        )
    finally:
        watch.stop.set()
        watcher.join(10)
    assert not watch.lapses, f"membership lapsed during the reconcile: {watch.lapses[:5]}"
    assert not watch.failed_calls, f"API calls on the reconciling process failed: {watch.failed_calls[:5]}"
    assert watch.settled_at is not None and watch.probes > 0
    churn = [c for c in watch.changes if c[0] > watch.settled_at]
    assert not churn, f"shards changed hands or epochs while the reconcile ran: {churn}"
    # Each job was put back once (d2 may have begun on the shard in the moment it held it), and the
    # test shows something only if the reconcile outlasted the leases it must not hold up.
    done = [
        e for d in (d1, d2) for e in logged(d, "restored jobs missing from Redis") if e["shard"] == bulk_shard
    ]
    assert sum(e["restored"] for e in done) == rows, done
    took = max(datetime.fromisoformat(e["timestamp"]).timestamp() for e in done) - lost_at_wall
    assert took > 3 * OWNERSHIP_TTL_MS / 1000, f"the reconcile took only {took:.1f} s"
    runs = starts(ledger)
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
    and answering reads within a second (enqueues, cancels and reads that wait for a status write
    within two); a worker runs the jobs as they come back, and each runs once."""
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
    """The same with the million rows of the incident."""
    reconcile_after_data_loss(
        1_000_000, start_dispatcher, start_worker, ledger, redis_url, db_url, drain_timeout=1500
    )
