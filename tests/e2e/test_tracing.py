"""OpenTelemetry traces through a real dispatcher process: the client's send span, the job's trace
context stored with it (DB row and Redis record) and the worker's process span of every attempt.

The client and the worker run in this process, so that their spans reach the SDK's in-memory
exporter; the dispatcher is a real process (with its own SDK and a file exporter for its spans).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.e2e.conftest import TEST_SETTINGS
from tests.support.processes import DispatcherProcess
from tests.support.tracing import captured_spans
from tests.support.wait import wait_for
from worker_sdk import AsyncClient, Client, InvalidArgumentError, JobContext, SkipRetry, serve

pytestmark = pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with captured_spans() as exporter:
        yield exporter


def _named(exporter: InMemorySpanExporter, prefix: str, job_id: str = "") -> list[ReadableSpan]:
    found = [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]
    if job_id:
        found = [s for s in found if (s.attributes or {}).get("messaging.message.id") == job_id]
    return found


def _processed(exporter: InMemorySpanExporter, job_id: str, attempts: int) -> list[ReadableSpan]:
    """The process spans of the job, once ``attempts`` of them have ended, by attempt."""
    found = _named(exporter, "process ", job_id)
    if len(found) < attempts:
        return []
    return sorted(found, key=lambda s: (s.attributes or {})["shardq.job.attempt"])


async def test_one_trace_from_enqueue_through_every_attempt(spans, dispatcher):
    tracer = trace.get_tracer("test")
    inner: list[Any] = []

    def flaky(ctx: JobContext) -> str:  # a plain handler: it runs in a thread
        with tracer.start_as_current_span("handler work") as span:
            inner.append(span.get_span_context())
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")
        return "ok"

    async def final(ctx: JobContext) -> None:
        raise SkipRetry("malformed input")

    client = AsyncClient(dispatcher.target)
    async with serve(
        {"flaky": flaky, "final": final}, target=dispatcher.target, handle_signals=False, concurrency=4
    ):
        with tracer.start_as_current_span("web request") as request:
            flaky_id = await client.enqueue("flaky", {"n": 1})
            final_id = await client.enqueue("final", None)
        request_context = request.get_span_context()

        attempts = await wait_for(lambda: _processed(spans, flaky_id, 2), timeout=15)
        [dead] = await wait_for(lambda: _processed(spans, final_id, 1), timeout=15)

    [send] = _named(spans, "send flaky")
    assert send.kind is SpanKind.PRODUCER
    assert send.parent is not None and send.parent.span_id == request_context.span_id
    assert send.context.trace_id == request_context.trace_id
    assert send.attributes["messaging.system"] == "shardq"
    assert send.attributes["messaging.operation.type"] == "send"
    assert send.attributes["messaging.destination.name"] == "flaky"
    assert send.attributes["messaging.message.id"] == flaky_id

    first, second = attempts
    for n, span in enumerate(attempts, start=1):
        assert span.kind is SpanKind.CONSUMER
        assert span.name == "process flaky"
        assert span.context.trace_id == request_context.trace_id, "the attempt is not in the producer's trace"
        assert span.parent is not None and span.parent.span_id == send.context.span_id
        assert [link.context.span_id for link in span.links] == [send.context.span_id]
        assert span.attributes["shardq.job.attempt"] == n
        assert span.attributes["messaging.operation.type"] == "process"
        assert span.attributes["messaging.message.id"] == flaky_id
        assert span.attributes["messaging.destination.partition.id"] == str(_shard_of(dispatcher, flaky_id))
    assert first.status.status_code is StatusCode.ERROR
    assert [e.name for e in first.events] == ["exception", "shardq.job.retry"]
    assert first.attributes["error.type"] == "RuntimeError"
    assert second.status.status_code is StatusCode.UNSET and not second.events

    # The handler's own span, made in its thread, is a child of its attempt's span.
    handler_spans = _named(spans, "handler work")
    parents = {s.parent.span_id for s in handler_spans if s.parent}
    assert parents == {first.context.span_id, second.context.span_id}

    assert dead.status.status_code is StatusCode.ERROR
    [dead_letter] = [e for e in dead.events if e.name == "shardq.job.dead_letter"]
    assert dead_letter.attributes["shardq.dead_reason"] == "not_retryable"
    assert dead.context.trace_id == request_context.trace_id

    job = await client.get_job(flaky_id)
    assert set(job.headers) == {"traceparent"}, job.headers
    assert job.headers["traceparent"].split("-")[2] == format(send.context.span_id, "016x")


def _shard_of(dispatcher: DispatcherProcess, job_id: str) -> int:
    with Client(dispatcher.target) as client:
        return client.get_job(job_id).shard


async def test_batch_enqueue_is_one_send_span_and_a_given_trace_context_is_kept(spans, dispatcher):
    done: list[str] = []

    async def record(ctx: JobContext) -> None:
        done.append(ctx.job_id)

    caller_parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with Client(dispatcher.target) as client:
        ids = client.enqueue_many(
            [
                {"type": "batch", "payload": 1},
                {"type": "batch", "payload": 2},
                {"type": "batch", "payload": 3, "headers": {"traceparent": caller_parent, "tenant": "acme"}},
            ]
        )
    async with serve({"batch": record}, target=dispatcher.target, handle_signals=False):
        await wait_for(lambda: len(_named(spans, "process batch")) == 3, timeout=15)

    [send] = _named(spans, "send batch")
    assert send.attributes["messaging.batch.message_count"] == 3
    by_job = {s.attributes["messaging.message.id"]: s for s in _named(spans, "process batch")}
    for job_id in ids[:2]:
        assert by_job[job_id].parent.span_id == send.context.span_id
        assert by_job[job_id].context.trace_id == send.context.trace_id
    # A creation context the caller put in the job is not replaced by the send span's.
    own = by_job[ids[2]]
    assert format(own.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert format(own.parent.span_id, "016x") == "b7ad6b7169203331"
    with Client(dispatcher.target) as client:
        assert client.get_job(ids[2]).headers == {"traceparent": caller_parent, "tenant": "acme"}


async def test_trace_context_survives_redis_data_loss(spans, start_dispatcher, private_redis, db_url):
    """The job waits delayed while its Redis loses everything: the reconcile puts it back from its
    row, headers included, and it runs in the trace it was enqueued in."""
    proc = start_dispatcher(private_redis.url, db_url)
    client = AsyncClient(proc.target)
    with trace.get_tracer("test").start_as_current_span("web request") as request:
        job_id = await client.enqueue("later", None, delay=3.0)
    await wait_for(lambda: _delayed(client), timeout=5)  # queued in Redis
    private_redis.client().flushall()

    async def later(ctx: JobContext) -> None:
        return None

    async with serve({"later": later}, target=proc.target, handle_signals=False):
        [span] = await wait_for(lambda: _processed(spans, job_id, 1), timeout=30)
    assert span.context.trace_id == request.get_span_context().trace_id
    [send] = _named(spans, "send later")
    assert span.parent is not None and span.parent.span_id == send.context.span_id
    assert (await client.get_job(job_id)).status == "succeeded"


async def _delayed(client: AsyncClient) -> bool:
    return any(q.type == "later" and q.delayed == 1 for q in await client.stats())


class _TracedDispatcher(DispatcherProcess):
    module = "tests.support.traced_dispatcher"


def _exported(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def test_dispatcher_spans_of_commit_push_and_lease_join_the_job_trace(
    spans, redis_url, db_url, tmp_path
):
    exported = tmp_path / "dispatcher-spans.jsonl"
    settings = {**TEST_SETTINGS, "trace_spans": 1, "test_spans_file": exported}
    proc = _TracedDispatcher(redis_url, db_url, tmp_path, **settings).start()
    try:

        async def noop(ctx: JobContext) -> None:
            return None

        client = AsyncClient(proc.target)
        async with serve({"traced": noop}, target=proc.target, handle_signals=False):
            job_id = await client.enqueue("traced", None)
            await wait_for(lambda: _processed(spans, job_id, 1), timeout=15)
        wanted = {"shardq commit", "shardq push", "shardq lease"}
        await wait_for(lambda: wanted <= {s["name"] for s in _exported(exported)}, timeout=10)
    finally:
        proc.kill()
    [send] = _named(spans, "send traced")
    trace_id = "0x" + format(send.context.trace_id, "032x")
    by_name = {s["name"]: s for s in _exported(exported) if s["context"]["trace_id"] == trace_id}
    assert {"shardq commit", "shardq push", "shardq lease"} <= set(by_name), _exported(exported)
    for span in by_name.values():
        assert span["parent_id"] == "0x" + format(send.context.span_id, "016x")
        assert span["attributes"]["messaging.batch.message_count"] == 1


async def test_dispatcher_spans_are_off_by_default(spans, redis_url, db_url, tmp_path):
    exported = tmp_path / "dispatcher-spans.jsonl"
    proc = _TracedDispatcher(redis_url, db_url, tmp_path, **{**TEST_SETTINGS, "test_spans_file": exported})
    proc.start()
    try:

        async def noop(ctx: JobContext) -> None:
            return None

        client = AsyncClient(proc.target)
        async with serve({"quiet": noop}, target=proc.target, handle_signals=False):
            job_id = await client.enqueue("quiet", None)
            await wait_for(lambda: _processed(spans, job_id, 1), timeout=15)
    finally:
        proc.kill()
    assert _exported(exported) == []


def test_bad_headers_are_refused_naming_the_field_and_fail_the_send_span(spans, dispatcher):
    with Client(dispatcher.target) as client:
        with pytest.raises(InvalidArgumentError, match=r"job\.headers\['big'\]: 2000 characters"):
            client.enqueue("refused", None, headers={"big": "x" * 2000})
        assert not [q for q in client.stats() if q.type == "refused"]
    [send] = _named(spans, "send refused")
    assert send.status.status_code is StatusCode.ERROR
