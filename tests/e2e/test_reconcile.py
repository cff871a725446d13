"""What the reconciler restores, and what it reports: a large reconcile after Redis lost its data
(ownership and the API go on while it runs); jobs whose push was on its way, or failed, while a second
dispatcher took its shards at start-up (queued once, no loss reported); a real loss, which is reported
with its count."""

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
from tests.support.ports import free_port
from tests.support.processes import DispatcherProcess, WorkerProcess
from tests.support.scrape import metric_total
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
                    + (now, now, None, None)  # enqueued_at, updated_at, concurrency_key, headers
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


SHARDS = 8  # the e2e dispatchers' shard count (tests/e2e/conftest.py)
LOSS_WARNING = "restored jobs missing from Redis"
UNPUSHED_INFO = "restored committed jobs whose push had failed"


def type_per_shard() -> list[str]:
    """A job type for each shard."""
    types: dict[int, str] = {}
    i = 0
    while len(types) < SHARDS:
        types.setdefault(shard_for(f"noop.s{i}", SHARDS), f"noop.s{i}")
        i += 1
    return [types[shard] for shard in range(SHARDS)]


def records_in_redis(redis_url: str) -> int:
    """Job records in every shard's working set."""
    client = redis.Redis.from_url(redis_url)
    try:
        return sum(int(client.hlen(ShardKeys(shard).jobs)) for shard in range(SHARDS))
    finally:
        client.close()


def shared_out(target: str) -> bool:
    """Both members own shards: the first has handed the second its share."""
    view = settled_view(target, 2)
    return view is not None and {s.owner for s in view.shards} == {"d1", "d2"}


def queued_by(port: int) -> dict[str, float]:
    """The jobs a dispatcher put into Redis: pushed by the enqueue path, restored by the reconciler."""
    return {
        "pushed": metric_total(port, "shardq_jobs_pushed_total"),
        "lost": metric_total(port, "shardq_reconciler_restored_total", cause="lost"),
        "unpushed": metric_total(port, "shardq_reconciler_restored_total", cause="unpushed"),
    }


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_enqueues_racing_a_second_dispatchers_start_are_queued_once_and_no_loss_is_reported(
    start_dispatcher: Callable[..., DispatcherProcess], redis_url: str, db_url: str
) -> None:
    """A producer bulk-enqueues 1,000 jobs a call, over every shard, through the first dispatcher while a
    second one starts: the first releases half of the shards and the second takes them and reconciles
    each. Jobs committed meanwhile are pushed behind their answer, handed to the new owner, or, while
    no process owns their shard, left to the new owner's reconcile: each reaches Redis exactly once
    (the enqueue path's pushes and the reconciler's restores add up to the jobs enqueued), and nothing
    is reported as missing from Redis, which an operator reads as data loss."""
    ports = [free_port(), free_port()]
    d1 = start_dispatcher(redis_url, db_url, dispatcher_id="d1", metrics_listen=f"127.0.0.1:{ports[0]}")
    d2 = start_dispatcher(
        redis_url, db_url, dispatcher_id="d2", metrics_listen=f"127.0.0.1:{ports[1]}", wait=False
    )
    batch = [{"type": t, "payload": None} for t in type_per_shard() for _ in range(1000 // SHARDS)]
    enqueued: list[str] = []
    with Client(d1.target, timeout=30) as client:
        # Until the second process owns its shards, and on while their first reconciles run.
        while not shared_out(d1.target):
            enqueued += client.enqueue_many(batch)
        for _ in range(20):
            enqueued += client.enqueue_many(batch)
    assert len(set(enqueued)) == len(enqueued)
    wait_until(
        lambda: records_in_redis(redis_url) >= len(enqueued),
        timeout=60,
        message=lambda: f"{records_in_redis(redis_url)} of {len(enqueued)} jobs in Redis",
    )
    warnings = [e for d in (d1, d2) for e in logged(d, LOSS_WARNING)]
    assert not warnings, f"jobs on their way reported as lost: {warnings}"
    assert records_in_redis(redis_url) == len(enqueued)

    # Every job is counted once: by the push that queued it, or by the restore that put it back (each
    # counted a moment after its script answered).
    def counted() -> list[dict[str, float]]:
        return [queued_by(port) for port in ports]

    wait_until(
        lambda: sum(sum(c.values()) for c in counted()) >= len(enqueued),
        timeout=10,
        message=lambda: f"{counted()}",
    )
    counts = counted()
    assert sum(sum(c.values()) for c in counts) == len(enqueued), counts
    assert sum(c["lost"] for c in counts) == 0, counts
    # A reconcile logs what it restored once it ends; one may still be looking for jobs pushed meanwhile.
    unpushed = sum(c["unpushed"] for c in counts)

    def logged_unpushed() -> int:
        return sum(e["restored"] for d in (d1, d2) for e in logged(d, UNPUSHED_INFO))

    wait_until(
        lambda: logged_unpushed() >= unpushed,
        timeout=20,
        message=lambda: f"{logged_unpushed()} logged of {counts}",
    )
    assert logged_unpushed() == unpushed
    assert not [e for d in (d1, d2) for e in logged(d, LOSS_WARNING)]


@pytest.mark.parametrize("loss", ["flushall", "keys deleted"])
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_real_loss_is_reported_with_its_count(
    loss: str, start_dispatcher: Callable[..., DispatcherProcess], redis_url: str, db_url: str
) -> None:
    """Redis loses committed jobs it held (a flush, or the keys of a shard deleted): the reconcile that
    puts them back reports them as missing from Redis, each of them, and as nothing else. The jobs are
    young: a young job missing from Redis is not taken for one whose push is on its way for ever."""
    port = free_port()
    proc = start_dispatcher(redis_url, db_url, metrics_listen=f"127.0.0.1:{port}")
    job_type = type_per_shard()[3]
    with Client(proc.target) as client:
        ids = client.enqueue_many([{"type": job_type, "payload": {"i": i}} for i in range(300)])
    wait_until(lambda: records_in_redis(redis_url) == len(ids), timeout=10)
    client_redis = redis.Redis.from_url(redis_url)
    try:
        if loss == "flushall":
            client_redis.flushall()  # the shard's meta too: its owner takes it back and restores it
        else:
            k = ShardKeys(3)
            # The shard's jobs and queues, not its meta: nothing tells the owner; its next reconcile
            # (asked for here, as a failed push asks) finds the jobs missing.
            client_redis.delete(k.jobs, k.payloads, k.delayed, k.counts, k.ready(job_type, Priority.DEFAULT))
            client_redis.sadd("shardq:dirty", 3)
    finally:
        client_redis.close()
    wait_until(
        lambda: logged(proc, LOSS_WARNING),
        timeout=30,
        message=lambda: f"no loss reported; {records_in_redis(redis_url)} of {len(ids)} jobs in Redis",
    )
    assert [(e["shard"], e["restored"]) for e in logged(proc, LOSS_WARNING)] == [(3, len(ids))]
    assert records_in_redis(redis_url) == len(ids)
    assert not logged(proc, UNPUSHED_INFO)
    counts = queued_by(port)
    assert (counts["lost"], counts["unpushed"]) == (len(ids), 0), counts
