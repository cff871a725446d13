"""Jobs enqueued inside a producer's own PostgreSQL transaction (shardq_enqueue_v2 through the SDK's
enqueue_in_transaction), run by real dispatcher and worker processes: a commit runs the job, a
rollback leaves no job and no trace in Redis, a dispatcher down at the commit runs it once it is
back, 10,000 jobs of one transaction all run, and with the LISTEN connection killed (and no new
connection possible) the sweep still finds the jobs. Version 2's concurrency keys obey their
type's per-key limit, its headers and the trace context reach the handler, and version 1 still
works."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from dispatcher.queue.keys import ShardKeys
from shardmap import shard_for
from tests.e2e.test_flow_control import executions, most_at_once
from tests.support.db import query
from tests.support.processes import DispatcherProcess, WorkerProcess, events
from tests.support.tracing import captured_spans
from tests.support.wait import wait_for, wait_until
from worker_sdk import (
    AsyncClient,
    Client,
    InvalidArgumentError,
    JobContext,
    enqueue_in_transaction,
    enqueue_in_transaction_async,
    enqueue_many_in_transaction,
    enqueue_many_in_transaction_async,
    serve,
)

SHARD_COUNT = 8  # tests/e2e/conftest.py TEST_SETTINGS

pytestmark = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)


def started(ledger: Path) -> set[str]:
    return {e["job"] for e in events(ledger, "start")}


def wait_started(ledger: Path, ids: set[str], timeout: float = 20.0) -> None:
    wait_until(
        lambda: ids <= started(ledger),
        timeout=timeout,
        interval=0.05,
        message=lambda: f"{len(ids - started(ledger))} of {len(ids)} jobs never started",
    )


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def test_a_committed_job_runs_and_a_rolled_back_one_leaves_no_job_and_no_trace(
    start_dispatcher: Callable[..., DispatcherProcess],
    start_worker: Callable[..., WorkerProcess],
    ledger: Path,
    redis_url: str,
    db_url: str,
    redis_client: redis.Redis,
) -> None:
    # A sweep too slow to matter here: the notification at the commit is what queues the job.
    dispatcher = start_dispatcher(redis_url, db_url, sql_enqueue_sweep_s=3600)
    start_worker(dispatcher.target, types="noop.txn")
    with psycopg.connect(db_url) as conn:
        # The application's own write and its job, in one transaction that rolls back...
        conn.execute("CREATE TABLE orders (id serial PRIMARY KEY, item text NOT NULL)")
        conn.commit()
        conn.execute("INSERT INTO orders (item) VALUES ('rolled back')")
        rolled_back = enqueue_in_transaction(conn, "noop.txn", {"order": "rolled back"})
        conn.rollback()
        # ...and one that commits.
        conn.execute("INSERT INTO orders (item) VALUES ('kept')")
        committed = enqueue_in_transaction(conn, "noop.txn", {"order": "kept"})
        conn.commit()
    wait_started(ledger, {committed})
    # Another job of the type's shard, committed after it and queued behind it (FIFO): once it has
    # run, the rolled-back one had every chance to.
    with psycopg.connect(db_url) as conn:
        sentinel = enqueue_in_transaction(conn, "noop.txn", {"order": "sentinel"})
        conn.commit()
    wait_started(ledger, {sentinel})
    assert rolled_back not in started(ledger)
    assert query(db_url, "SELECT id FROM jobs WHERE id = ?", (rolled_back,)) == []
    assert query(db_url, "SELECT id FROM jobs_to_push") == []  # every committed job was pushed
    keys = ShardKeys(shard_for("noop.txn", SHARD_COUNT))
    assert not redis_client.hexists(keys.jobs, rolled_back)
    assert not redis_client.hexists(keys.payloads, rolled_back)
    assert query(db_url, "SELECT item FROM orders") == [("kept",)]


def test_a_job_committed_while_no_dispatcher_runs_runs_when_one_is_back(
    start_dispatcher: Callable[..., DispatcherProcess],
    start_worker: Callable[..., WorkerProcess],
    ledger: Path,
    redis_url: str,
    db_url: str,
) -> None:
    dispatcher = start_dispatcher(redis_url, db_url, sql_enqueue_sweep_s=3600)
    dispatcher.kill()  # it applied the migrations and recorded the shard count: the functions work
    with psycopg.connect(db_url) as conn:
        ids = set(
            enqueue_many_in_transaction(conn, [{"type": f"noop.down{i}", "payload": {}} for i in range(8)])
        )
        conn.commit()
    # A long outage: the jobs are older than the time a push is given to land (reconciler.IN_FLIGHT_MS),
    # so the reconcile on acquisition finds them missing from Redis before the push does.
    query(db_url, "UPDATE jobs SET enqueued_at = enqueued_at - 60000, updated_at = updated_at - 60000")
    dispatcher.start()
    start_worker(dispatcher.target, types=",".join(f"noop.down{i}" for i in range(8)))
    wait_started(ledger, ids)
    # Pushed as committed jobs whose push was pending, not reported as lost from Redis.
    assert "restored jobs missing from Redis" not in dispatcher.log_tail(400)


def test_ten_thousand_jobs_of_one_transaction_all_run(
    start_dispatcher: Callable[..., DispatcherProcess],
    start_worker: Callable[..., WorkerProcess],
    ledger: Path,
    redis_url: str,
    db_url: str,
) -> None:
    dispatcher = start_dispatcher(redis_url, db_url)
    start_worker(dispatcher.target, types=",".join(f"noop.bulk{i}" for i in range(16)), concurrency=256)
    with psycopg.connect(db_url) as conn:
        jobs = [{"type": f"noop.bulk{i % 16}", "payload": {"i": i}} for i in range(10_000)]
        ids = enqueue_many_in_transaction(conn, jobs)
        conn.commit()
    assert len(set(ids)) == 10_000
    wait_started(ledger, set(ids), timeout=90)
    runs = [e["job"] for e in events(ledger, "start")]
    assert len(runs) == 10_000  # each once


def test_with_the_listen_connection_killed_and_no_new_connection_possible_the_sweep_finds_the_jobs(
    start_dispatcher: Callable[..., DispatcherProcess],
    start_worker: Callable[..., WorkerProcess],
    ledger: Path,
    redis_url: str,
    db_url: str,
    pg_admin_url: str,
) -> None:
    dispatcher = start_dispatcher(redis_url, db_url, sql_enqueue_sweep_s=0.5)
    start_worker(dispatcher.target, types="noop.swept")
    name = db_url.rsplit("/", 1)[1]
    producer = psycopg.connect(db_url)  # opened before the database refuses new connections
    try:
        listener = wait_until(
            lambda: query(
                pg_admin_url,
                "SELECT pid FROM pg_stat_activity WHERE datname = ? AND query = 'LISTEN shardq_enqueued'",
                (name,),
            ),
            timeout=10,
        )
        # The dispatcher cannot listen again: every notification of the commit below goes unheard.
        query(pg_admin_url, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            assert query(pg_admin_url, "SELECT pg_terminate_backend(?)", (listener[0][0],)) == [(True,)]
            wait_until(
                lambda: "not listening for SQL enqueues" in dispatcher.log_tail(200),
                timeout=10,
                message="the dispatcher did not notice its LISTEN connection was gone",
            )
            ids = set(enqueue_many_in_transaction(producer, [{"type": "noop.swept", "payload": {}}] * 5))
            producer.commit()
            wait_started(ledger, ids)
        finally:
            query(pg_admin_url, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        # Listening again, it is the notification that queues a job, well within a sweep's interval.
        wait_until(
            lambda: query(
                pg_admin_url,
                "SELECT pid FROM pg_stat_activity WHERE datname = ? AND query = 'LISTEN shardq_enqueued'",
                (name,),
            ),
            timeout=15,
        )
        again = enqueue_in_transaction(producer, "noop.swept", {})
        producer.commit()
        wait_started(ledger, {again})
    finally:
        producer.close()


def test_bad_input_names_the_field_and_inserts_nothing(
    start_dispatcher: Callable[..., DispatcherProcess], redis_url: str, db_url: str
) -> None:
    start_dispatcher(redis_url, db_url)
    with psycopg.connect(db_url) as conn:
        with pytest.raises(
            InvalidArgumentError, match=r"^INVALID_ARGUMENT: jobs\[1\]\.max_attempts: must be in"
        ):
            enqueue_many_in_transaction(
                conn, [{"type": "noop.ok", "payload": {}}, {"type": "noop.ok", "max_attempts": 5000}]
            )
        conn.rollback()
    assert query(db_url, "SELECT COUNT(*) FROM jobs") == [(0,)]
    assert query(db_url, "SELECT COUNT(*) FROM jobs_to_push") == [(0,)]


def ended(ledger: Path) -> set[str]:
    return {e["job"] for e in events(ledger, "end")}


def test_keyed_jobs_enqueued_in_a_transaction_obey_their_types_per_key_limit(
    start_dispatcher: Callable[..., DispatcherProcess],
    start_worker: Callable[..., WorkerProcess],
    ledger: Path,
    redis_url: str,
    db_url: str,
) -> None:
    """3 keys, at most 1 running per key, a worker with room for 20: no key ever runs 2 at once by
    the ledger, while different keys do run together (the worker would overlap them)."""
    dispatcher = start_dispatcher(redis_url, db_url)
    with Client(dispatcher.target) as client:
        client.set_queue_settings("sleep_txn_keyed", key_concurrency=1)
    start_worker(dispatcher.target, types="sleep_txn_keyed", concurrency=20)
    with psycopg.connect(db_url) as conn:
        ids = enqueue_many_in_transaction(
            conn,
            [
                {"type": "sleep_txn_keyed", "payload": {"sleep": 0.05}, "concurrency_key": f"tenant-{i % 3}"}
                for i in range(24)
            ],
        )
        ids.append(
            enqueue_in_transaction(conn, "sleep_txn_keyed", {"sleep": 0.05}, concurrency_key="tenant-0")
        )
        conn.commit()
    wait_until(
        lambda: set(ids) <= ended(ledger),
        timeout=60,
        message=lambda: f"{len(set(ids) - ended(ledger))} jobs never ran",
    )
    runs = executions(ledger)
    by_key: dict[str, list[Any]] = defaultdict(list)
    for run in runs:
        by_key[run[2]["key"]].append(run)
    assert sorted(by_key) == ["tenant-0", "tenant-1", "tenant-2"]  # the key reached the handler
    peaks = {key: most_at_once(key_runs) for key, key_runs in by_key.items()}
    assert max(peaks.values()) == 1, peaks
    assert most_at_once(runs) >= 2, "keys never ran together: the limit was never what held them apart"
    stored = query(db_url, "SELECT DISTINCT concurrency_key FROM jobs ORDER BY 1")
    assert stored == [("tenant-0",), ("tenant-1",), ("tenant-2",)]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with captured_spans() as exporter:
        yield exporter


async def test_headers_and_the_trace_of_the_transaction_reach_the_handler(
    spans: InMemorySpanExporter,
    start_dispatcher: Callable[..., DispatcherProcess],
    redis_url: str,
    db_url: str,
) -> None:
    """A request span open around the transaction: the helpers' send span is its child, the job's
    process span the send span's child, in one trace; the caller's headers and a traceparent it gave
    are delivered as given (ctx.headers and get_job)."""
    dispatcher = start_dispatcher(redis_url, db_url)
    tracer = trace.get_tracer("test")
    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    seen: dict[str, tuple[dict[str, str], Any]] = {}

    async def record(ctx: JobContext) -> None:
        seen[ctx.job_id] = (dict(ctx.headers), trace.get_current_span().get_span_context())

    async with serve({"traced.txn": record}, target=dispatcher.target, handle_signals=False):
        with tracer.start_as_current_span("web request") as request:
            async with await psycopg.AsyncConnection.connect(db_url) as conn:
                one = await enqueue_in_transaction_async(conn, "traced.txn", {}, headers={"tenant": "acme"})
                many = await enqueue_many_in_transaction_async(
                    conn,
                    [
                        {"type": "traced.txn", "headers": {"traceparent": given, "tenant": "globex"}},
                        {"type": "traced.txn"},
                    ],
                )
                await conn.commit()
        await wait_for(lambda: {one, *many} <= seen.keys(), timeout=15, message="the jobs never ran")
    request_context = request.get_span_context()
    sends = [s for s in spans.get_finished_spans() if s.name == "send traced.txn"]
    assert len(sends) == 2 and {s.kind for s in sends} == {SpanKind.PRODUCER}
    assert {s.parent.span_id for s in sends if s.parent} == {request_context.span_id}
    [send_one] = [s for s in sends if (s.attributes or {}).get("messaging.message.id") == one]
    [send_many] = [s for s in sends if s is not send_one]
    assert send_many.attributes["messaging.batch.message_count"] == 2

    headers, handler_span = seen[one]
    assert headers["tenant"] == "acme"
    assert headers["traceparent"].split("-")[1:3] == [
        format(request_context.trace_id, "032x"),
        format(send_one.context.span_id, "016x"),
    ]
    assert handler_span.trace_id == request_context.trace_id  # the handler runs in the request's trace
    [process] = [
        s
        for s in spans.get_finished_spans()
        if s.name == "process traced.txn" and (s.attributes or {})["messaging.message.id"] == one
    ]
    assert process.parent is not None and process.parent.span_id == send_one.context.span_id
    assert process.context.span_id == handler_span.span_id

    assert seen[many[0]][0] == {"traceparent": given, "tenant": "globex"}  # a given context is kept
    assert seen[many[0]][1].trace_id == int(given.split("-")[1], 16)
    assert seen[many[1]][0]["traceparent"].split("-")[2] == format(send_many.context.span_id, "016x")
    async with AsyncClient(dispatcher.target) as client:
        assert (await client.get_job(one)).headers == headers
        assert (await client.get_job(many[0])).headers == {"traceparent": given, "tenant": "globex"}


def test_a_bad_concurrency_key_or_header_is_refused_with_the_rpcs_message_and_inserts_nothing(
    start_dispatcher: Callable[..., DispatcherProcess], redis_url: str, db_url: str
) -> None:
    dispatcher = start_dispatcher(redis_url, db_url)
    bad: list[dict[str, Any]] = [
        {"concurrency_key": "k" * 129},
        {"concurrency_key": "line\nbreak"},
        {"headers": {"bad name": "x"}},
        {"headers": {"it's": "x"}},
        {"headers": {"note": "tab\there"}},
        {"headers": {"big": "x" * 1025}},
        {"headers": {f"h{i}": "x" for i in range(17)}},
        {"headers": {f"h{i}": "x" * 1000 for i in range(5)}},
    ]
    with Client(dispatcher.target) as client, psycopg.connect(db_url) as conn:
        for fields in bad:
            with pytest.raises(InvalidArgumentError) as by_rpc:
                client.enqueue_many([{"type": "noop.ok"}, {"type": "noop.ok", **fields}])
            with pytest.raises(InvalidArgumentError) as in_transaction:
                enqueue_many_in_transaction(conn, [{"type": "noop.ok"}, {"type": "noop.ok", **fields}])
            conn.rollback()
            assert in_transaction.value.details == by_rpc.value.details, fields
            assert by_rpc.value.details.startswith("jobs[1]."), by_rpc.value.details
            with pytest.raises(InvalidArgumentError) as by_rpc:
                client.enqueue("noop.ok", None, **fields)
            with pytest.raises(InvalidArgumentError) as in_transaction:
                enqueue_in_transaction(conn, "noop.ok", None, **fields)
            conn.rollback()
            assert in_transaction.value.details == by_rpc.value.details, fields
            assert in_transaction.value.code.name == "INVALID_ARGUMENT"
    assert query(db_url, "SELECT COUNT(*) FROM jobs") == [(0,)]
    assert query(db_url, "SELECT COUNT(*) FROM jobs_to_push") == [(0,)]


def test_version_1_still_enqueues_in_a_transaction(
    start_dispatcher: Callable[..., DispatcherProcess],
    start_worker: Callable[..., WorkerProcess],
    ledger: Path,
    redis_url: str,
    db_url: str,
) -> None:
    dispatcher = start_dispatcher(redis_url, db_url)
    start_worker(dispatcher.target, types="noop.v1")
    with psycopg.connect(db_url) as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"^job\.max_attempts: must be in"):
            conn.execute("SELECT shardq_enqueue_v1('noop.v1', '', max_attempts => 0)")
        conn.rollback()
        [(one,)] = conn.execute("SELECT shardq_enqueue_v1('noop.v1', '{}'::bytea, priority => 'high')")
        [(many,)] = conn.execute(
            "SELECT shardq_enqueue_many_v1(ARRAY['noop.v1', 'noop.v1'], ARRAY['{}', '{}']::bytea[])"
        )
        conn.commit()
    wait_started(ledger, {one, *many})
    rows = query(db_url, "SELECT priority, concurrency_key, headers FROM jobs ORDER BY priority")
    assert rows == [(0, None, None), (1, None, None), (1, None, None)]
