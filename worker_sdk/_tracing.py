"""OpenTelemetry traces of jobs, from the enqueue to each attempt of the handler.

Active when ``opentelemetry-api`` is importable (``pip install 'shardq[otel]'``); without it every
function here does nothing and nothing is imported. Spans go to whatever tracer provider the
application set up (none set: the API's no-op one).

Following the OpenTelemetry messaging semantic conventions:

- ``Client.enqueue`` / ``enqueue_many`` (sync and async) make one PRODUCER span, ``send <type>``
  (``messaging.operation.type`` "send"), and inject its context as the W3C ``traceparent`` /
  ``tracestate`` headers of every job they send: the creation context of the job, stored with it
  (DB row and Redis record) so that it outlives retries and a loss of Redis's data. A job whose
  headers already carry a ``traceparent`` keeps it (a creation context given by the caller is not
  modified, as the conventions ask).
- The worker runs each attempt in a CONSUMER span, ``process <type>`` (operation type "process",
  a push-based consumer: no "receive" span). It links to the job's creation context, as the
  conventions require of a process span, and is also its child: it processes exactly one message,
  the case in which they allow the creation context as parent. So one trace holds the request that
  enqueued the job, the send span and every attempt, each with ``shardq.job.attempt``.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    ENABLED = True
except ImportError:  # the otel extra is not installed: tracing is off
    ENABLED = False

from shardq_common.pb import shardq_pb2 as pb

from ._errors import Retry

SYSTEM = "shardq"
#: The headers the trace context travels in (W3C Trace Context).
TRACE_HEADERS = ("traceparent", "tracestate")
# Only the W3C trace context, whatever global propagator the application set: baggage or another
# format could outgrow the bounded headers (SHARDQ validates them) and carries nothing a span needs.
_PROPAGATOR = TraceContextTextMapPropagator() if ENABLED else None
_TRACER = trace.get_tracer("shardq.worker_sdk") if ENABLED else None
_NO_PROVIDER = (trace.ProxyTracerProvider, trace.NoOpTracerProvider) if ENABLED else ()
T = TypeVar("T")
P = ParamSpec("P")


def _provider_set() -> bool:
    """Whether the application set a tracer provider (looked up each time: it may set one after
    this module is imported). Until then every span would be a no-op: none is made, which keeps the
    API's own cost off each enqueue and each job when it is installed but unused."""
    return not isinstance(trace.get_tracer_provider(), _NO_PROVIDER)


def active() -> bool:
    """Whether spans are made now: the API is installed and the application set a provider."""
    return _TRACER is not None and _provider_set()


@contextmanager
def sending(specs: list[pb.JobSpec]) -> Iterator[Any]:
    """A PRODUCER span around an enqueue of ``specs``, its context injected into their headers.
    Yields the span (None when tracing is off); an exception out of the block marks it failed."""
    if not specs or not active() or _TRACER is None or _PROPAGATOR is None:
        yield None
        return
    types = {spec.type for spec in specs}
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
    }
    destination = next(iter(types)) if len(types) == 1 else ""
    if destination:
        attributes["messaging.destination.name"] = destination
    if len(specs) > 1:
        attributes["messaging.batch.message_count"] = len(specs)
    name = f"send {destination}" if destination else "send"
    with _TRACER.start_as_current_span(name, kind=trace.SpanKind.PRODUCER, attributes=attributes) as span:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)  # empty when the span is not sampled in any way (no provider)
        if carrier:
            for spec in specs:
                if "traceparent" not in spec.headers:
                    spec.headers.update(carrier)
        yield span


def sent(span: Any, job_ids: list[str]) -> None:
    """The ids the enqueue returned, on its span."""
    if span is not None and len(job_ids) == 1:
        span.set_attribute("messaging.message.id", job_ids[0])


@contextmanager
def processing(
    job_id: str, job_type: str, attempt: int, max_attempts: int, shard: int, headers: Mapping[str, str]
) -> Iterator[Any]:
    """The CONSUMER span of one attempt, made current for the handler: for a job the worker
    traces (it asked ``active()`` once for the message that leased it). Yields None when the API
    is not installed."""
    if _TRACER is None or _PROPAGATOR is None:
        yield None
        return
    # An empty context (not the current one) without a trace context: a job enqueued untraced
    # starts its own trace rather than joining whatever the worker's task happens to carry.
    parent = _PROPAGATOR.extract(headers) if "traceparent" in headers else otel_context.Context()
    creation = trace.get_current_span(parent).get_span_context()
    links = [trace.Link(creation)] if creation.is_valid else []
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": job_type,
        "messaging.destination.partition.id": str(shard),
        "messaging.message.id": job_id,
        "shardq.job.attempt": attempt,
        "shardq.job.max_attempts": max_attempts,
    }
    with _TRACER.start_as_current_span(
        f"process {job_type}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
        # The outcome is recorded from the nack (finished below), not from an escaping exception.
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def finished(
    span: Any, attempt: int, max_attempts: int, nack: pb.Nack | None, error: BaseException | None
) -> None:
    """Record an attempt's outcome on its span: nothing more for an ack; for a nack an ERROR status
    (but for a requested Retry), the exception, and an event saying what comes next."""
    if span is None or nack is None:
        return
    if error is not None:
        span.record_exception(error)
        span.set_attribute("error.type", type(error).__qualname__)
    elif nack.no_handler:
        span.set_attribute("error.type", "no_handler")
    if not isinstance(error, Retry):  # a retry the handler asked for is no error of the attempt
        first_line = (nack.error.strip().splitlines() or [""])[-1][:200]
        span.set_status(trace.Status(trace.StatusCode.ERROR, first_line))
    if nack.error == "cancelled" and not nack.retryable:
        span.add_event("shardq.job.cancelled")
    elif nack.retryable and attempt < max_attempts:
        event: dict[str, Any] = {"shardq.job.attempt": attempt}
        if nack.HasField("retry_delay_ms"):
            event["shardq.job.retry_delay_ms"] = nack.retry_delay_ms
        span.add_event("shardq.job.retry", event)
    else:
        # The dispatcher dead-letters a job whose handler said the error is final, or whose attempts
        # are used up (lease expiries count too, with the default SHARDQ_RETRY_COUNT_EXPIRATIONS).
        span.add_event(
            "shardq.job.dead_letter",
            {"shardq.job.attempt": attempt, "shardq.dead_reason": _dead_reason(nack)},
        )


def _dead_reason(nack: pb.Nack) -> str:
    if nack.no_handler:
        return "no_handler"
    return "handler_error" if nack.retryable else "not_retryable"


def lease_lost(span: Any, reason: str) -> None:
    if span is not None:
        span.set_status(trace.Status(trace.StatusCode.ERROR, f"lease lost: {reason}"))
        span.add_event("shardq.job.lease_lost", {"shardq.reason": reason})


def bound_to_context(call: Callable[P, T]) -> Callable[P, T]:
    """``call`` run in a copy of the current context, so that a handler in a thread sees the process
    span as current (a thread pool does not carry context variables over by itself). With no
    OpenTelemetry context current (no span: tracing is off), ``call`` itself, at no cost."""
    if not ENABLED or not otel_context.get_current():
        return call
    context = contextvars.copy_context()

    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return context.run(call, *args, **kwargs)

    return run
