"""Limits against abuse, end to end with real dispatcher processes: every request is bounded in size
(the token is checked before the body is read) and in count, a worker's lease refs reach Redis in
bounded script calls, Stats reads the dead-letter depth without scanning the dead-letter queue, and
idempotency keys belong to their job type, so one tenant cannot take another's key."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import grpc
import psycopg
import pytest
import redis

from dispatcher.queue.keys import DIRTY_KEY, ShardKeys
from dispatcher.queue.working_set import SCRIPT_BATCH
from shardmap import shard_for
from shardq_common.pb import shardq_pb2 as pb
from shardq_common.pb import shardq_pb2_grpc as pb_grpc
from shardq_common.tls import ChannelSecurity
from tests.support.shard_map import settled_view
from tests.support.snapshots import count_jobs, db_digest, redis_digest
from tests.support.wait import wait_until
from worker_sdk import Client

MiB = 1 << 20
ADMIN = "admin-token-0123456789"
BILLING = "producer-billing-0123456789"
EMAIL = "producer-email-0123456789"
TOKENS = f"{ADMIN} role=admin; {BILLING} role=producer types=billing.*; {EMAIL} role=producer types=email.*"


def _with_auth(start_dispatcher: Any, redis_url: str, db_url: str, **settings: Any) -> Any:
    probe = ChannelSecurity.resolve(token=ADMIN, env={})
    return start_dispatcher(redis_url, db_url, security=probe, auth_tokens=TOKENS, **settings)


def _bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def _code_of(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details() or ""


def test_a_request_over_the_size_limit_is_refused_and_changes_nothing(start_dispatcher, redis_url, db_url):
    dispatcher = start_dispatcher(redis_url, db_url, max_request_bytes=2 * MiB)
    before_redis, before_db = redis_digest(redis_url), db_digest(db_url)
    with grpc.insecure_channel(dispatcher.target) as channel:
        stub = pb_grpc.JobServiceStub(channel)
        # Every payload is within its own limit (1 MiB); together they are over the request's.
        jobs = [pb.JobSpec(type="noop", payload=b"x" * (900 << 10)) for _ in range(3)]
        code, details = _code_of(lambda: stub.EnqueueMany(pb.EnqueueManyRequest(jobs=jobs), timeout=20))
        assert code is grpc.StatusCode.RESOURCE_EXHAUSTED, details
        assert redis_digest(redis_url).changed(before_redis) == []
        assert db_digest(db_url) == before_db
        # Within the limit: accepted, and the dispatcher still serves.
        response = stub.EnqueueMany(pb.EnqueueManyRequest(jobs=jobs[:2]), timeout=20)
        assert len(response.job_ids) == 2 and all(response.created)
    assert count_jobs(db_url) == 2


def test_the_token_is_checked_before_the_body_is_read(start_dispatcher, redis_url, tmp_path):
    """An unauthenticated body over the size limit is refused as UNAUTHENTICATED: the dispatcher
    answered from the metadata, without reading the body (reading it would have hit the limit)."""
    dispatcher = _with_auth(
        start_dispatcher, redis_url, f"sqlite:///{tmp_path}/auth.sqlite3", max_request_bytes=2 * MiB
    )
    big = pb.EnqueueManyRequest(jobs=[pb.JobSpec(type="billing.x", payload=b"x" * (900 << 10))] * 3)
    with grpc.insecure_channel(dispatcher.target) as channel:
        stub = pb_grpc.JobServiceStub(channel)
        code, details = _code_of(lambda: stub.EnqueueMany(big, timeout=20))
        assert code is grpc.StatusCode.UNAUTHENTICATED, details
        code, details = _code_of(
            lambda: stub.EnqueueMany(big, timeout=20, metadata=_bearer("not-a-token-at-all"))
        )
        assert code is grpc.StatusCode.UNAUTHENTICATED, details
        code, details = _code_of(lambda: stub.EnqueueMany(big, timeout=20, metadata=_bearer(BILLING)))
        assert code is grpc.StatusCode.RESOURCE_EXHAUSTED, details
        ok = stub.Enqueue(pb.EnqueueRequest(job=pb.JobSpec(type="billing.x")), metadata=_bearer(BILLING))
        assert ok.created


@pytest.fixture
def monitor(redis_url: str) -> Iterator[list[str]]:
    """Every command Redis runs while the test runs (MONITOR), as text."""
    seen: list[str] = []
    client = redis.Redis.from_url(redis_url)
    stop = threading.Event()
    with client.monitor() as m:

        def read() -> None:
            while not stop.is_set():
                try:
                    seen.append(m.next_command()["command"])
                except (redis.ConnectionError, ValueError, OSError):
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            yield seen
        finally:
            stop.set()
            client.ping()  # one more command, so the reader wakes and sees the stop
            reader.join(timeout=5)
    client.close()


def test_a_heartbeat_reaches_redis_in_bounded_script_calls(dispatcher, monitor):
    """The most lease refs a worker message may carry are extended in script calls of at most
    SCRIPT_BATCH refs each, so no single call holds Redis for long."""
    n = 10_000
    refs = [pb.LeaseRef(job_id=f"hb-job-{i}", token=f"tok-{i}", shard=0) for i in range(n)]
    hello = pb.Hello(worker_id="hb-test", job_types=["unused_type"], concurrency=1)
    outbox: list[pb.WorkerMessage] = [
        pb.WorkerMessage(hello=hello),
        pb.WorkerMessage(heartbeat=pb.Heartbeat(leases=refs)),
    ]
    done = threading.Event()

    def requests() -> Iterator[pb.WorkerMessage]:
        yield from outbox
        done.wait(30)

    with grpc.insecure_channel(dispatcher.target) as channel:
        responses = pb_grpc.WorkerServiceStub(channel).Connect(requests(), timeout=30)
        rejected = 0
        try:
            for message in responses:
                if message.WhichOneof("msg") == "rejected":
                    rejected += len(message.rejected.leases)
                    if rejected >= n:
                        break
        finally:
            done.set()
            responses.cancel()
    assert rejected == n

    def per_call() -> list[int]:
        """Refs per script call (MONITOR also shows the commands each script runs)."""
        calls = [c for c in list(monitor) if c.split(" ", 1)[0].upper() in ("EVALSHA", "EVAL")]
        return [c.count("hb-job-") for c in calls if "hb-job-" in c]

    # The monitor's reader thread may still be parsing the last call's (long) line.
    wait_until(lambda: sum(per_call()) >= n, timeout=10)  # a call answered NOSCRIPT is sent again
    assert max(per_call()) <= SCRIPT_BATCH, per_call()


def test_idempotency_keys_are_scoped_by_job_type(dispatcher, db_url):
    with Client(dispatcher.target, timeout=20) as client:
        first = client.enqueue("scope.a", {"n": 1}, idempotency_key="order-1")
        other = client.enqueue("scope.b", {"n": 2}, idempotency_key="order-1")
        assert other != first
        assert client.enqueue("scope.a", {"n": 3}, idempotency_key="order-1") == first
        assert (client.get_job(first).type, client.get_job(other).type) == ("scope.a", "scope.b")
    with grpc.insecure_channel(dispatcher.target) as channel:
        batch = [
            pb.JobSpec(type="scope.a", idempotency_key="order-2"),
            pb.JobSpec(type="scope.b", idempotency_key="order-2"),
            pb.JobSpec(type="scope.a", idempotency_key="order-2"),
            pb.JobSpec(type="scope.b", idempotency_key="order-1"),
        ]
        response = pb_grpc.JobServiceStub(channel).EnqueueMany(pb.EnqueueManyRequest(jobs=batch), timeout=20)
        ids = list(response.job_ids)
        assert list(response.created) == [True, True, False, False]
        assert ids[0] == ids[2] != ids[1] and ids[3] == other
    assert count_jobs(db_url) == 4


def test_a_scoped_producer_cannot_take_another_tenants_idempotency_key(start_dispatcher, redis_url, db_url):
    dispatcher = _with_auth(start_dispatcher, redis_url, db_url)
    with grpc.insecure_channel(dispatcher.target) as channel:
        stub = pb_grpc.JobServiceStub(channel)
        squatted = stub.Enqueue(
            pb.EnqueueRequest(job=pb.JobSpec(type="billing.x", idempotency_key="welcome-42")),
            metadata=_bearer(BILLING),
            timeout=20,
        )
        mine = stub.Enqueue(
            pb.EnqueueRequest(job=pb.JobSpec(type="email.send", idempotency_key="welcome-42")),
            metadata=_bearer(EMAIL),
            timeout=20,
        )
        assert mine.created and mine.job_id != squatted.job_id
        job = stub.GetJob(pb.GetJobRequest(job_id=mine.job_id), metadata=_bearer(EMAIL), timeout=20)
        assert (job.type, job.idempotency_key) == ("email.send", "welcome-42")


def _dead_in_stats(client: Client, job_type: str) -> int:
    return sum(q.dead for q in client.stats() if q.type == job_type)


def test_stats_dead_counts_follow_every_transition(dispatcher, db_url, start_worker):
    """The dead-letter depth in Stats is kept with the transitions: dead-lettered, requeued, purged."""
    with Client(dispatcher.target, timeout=20) as client:
        ids = [client.enqueue("final_limits", {"i": i}) for i in range(5)]
        worker = start_worker(dispatcher.target, types="final_limits")
        wait_until(lambda: _dead_in_stats(client, "final_limits") == 5, timeout=30)
        worker.kill()
        assert client.requeue_dead(ids[:2]) == 2
        wait_until(lambda: _dead_in_stats(client, "final_limits") == 3, timeout=10)
        assert client.purge_dead(job_type="final_limits") == 3
        assert _dead_in_stats(client, "final_limits") == 0
        assert {client.get_job(i).status for i in ids[:2]} == {"ready"}


def test_stats_does_not_scan_the_dead_letter_queue(dispatcher, db_url, start_worker):
    """With the jobs table locked by another session, Stats still answers with the dead-letter depth:
    it never reads the jobs table, so its cost does not grow with the dead-letter queue."""
    if not db_url.startswith("postgresql"):
        pytest.skip("table locks that leave other tables readable are PostgreSQL's")
    with Client(dispatcher.target, timeout=20) as client:
        for i in range(3):
            client.enqueue("final_scan", {"i": i})
        worker = start_worker(dispatcher.target, types="final_scan")
        wait_until(lambda: _dead_in_stats(client, "final_scan") == 3, timeout=30)
        worker.kill()
        with psycopg.connect(db_url) as conn:
            conn.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
            try:
                with Client(dispatcher.target, timeout=5) as quick:
                    assert _dead_in_stats(quick, "final_scan") == 3
            finally:
                conn.rollback()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_hand_off_is_split_to_fit_the_owners_request_limit(start_dispatcher, redis_url, db_url):
    """A batch just within the request limit, of another process's shard: handed over with each
    job's record added it would be over the owner's limit, so it goes in parts, none refused."""
    owner_proc = start_dispatcher(redis_url, db_url, dispatcher_id="d1", max_request_bytes=2 * MiB)
    taker = start_dispatcher(redis_url, db_url, dispatcher_id="d2", max_request_bytes=2 * MiB)
    view = wait_until(lambda: settled_view(taker.target, 2), timeout=30)
    owner = {s.shard: s.owner for s in view.shards}
    job_type = next(t for t in (f"noop.big{i}" for i in range(200)) if owner[shard_for(t, 8)] == "d1")
    jobs = [pb.JobSpec(type=job_type, payload=b"p" * 180) for _ in range(10_000)]
    request = pb.EnqueueManyRequest(jobs=jobs)
    assert 1.5 * MiB < request.ByteSize() < 2 * MiB
    with grpc.insecure_channel(taker.target) as channel:
        response = pb_grpc.JobServiceStub(channel).EnqueueMany(request, timeout=60)
    assert len(response.job_ids) == 10_000
    shard = shard_for(job_type, 8)
    with redis.Redis.from_url(redis_url) as r:
        wait_until(lambda: r.hlen(ShardKeys(shard).jobs) == 10_000, timeout=30)
        assert not r.sismember(DIRTY_KEY, shard)
    assert "hand-off to the shard owner failed" not in taker.log_tail(10_000)
    assert owner_proc.process is not None and owner_proc.process.poll() is None
