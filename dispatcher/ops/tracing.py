"""The dispatcher's spans of its own work on jobs: commit, push and lease. Off by default.

``SHARDQ_TRACE_SPANS=1`` turns them on; it needs ``opentelemetry-api`` (the ``otel`` extra) and a
tracer provider set up in the process, for example by running the dispatcher under
``opentelemetry-instrument`` (from ``opentelemetry-distro``, configured by the ``OTEL_*`` variables).

Each span covers one batch: ``shardq commit`` (the enqueue's DB transaction), ``shardq push`` (its
jobs into a shard's Redis sets) and ``shardq lease`` (a lease batch to one worker). A batch whose
jobs share one creation context (one enqueue call) is its child, so it shows in the producer's
trace between the send span and the process spans; a batch of several traces links to them (up to
MAX_LINKS) and is a root span of its own. Off, the hooks cost one attribute read per batch.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from shardq_common.errors import ConfigError

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    AVAILABLE = True
except ImportError:  # the otel extra is not installed
    AVAILABLE = False

# Links a batch span carries at most: a lease batch of 1,000 jobs of as many traces needs no more
# than a sample to be found from each of them.
MAX_LINKS = 32


class _Spans:
    enabled = False
    _tracer: Any = None
    _propagator: Any = None

    def configure(self, enabled: bool) -> None:
        if enabled and not AVAILABLE:
            raise ConfigError(
                "SHARDQ_TRACE_SPANS needs opentelemetry-api: pip install 'shardq[dispatcher,otel]'"
            )
        self.enabled = enabled
        if enabled:
            self._tracer = trace.get_tracer("shardq.dispatcher")
            self._propagator = TraceContextTextMapPropagator()

    def record(
        self,
        name: str,
        start_ns: int,
        headers: Iterable[Mapping[str, str] | None],
        attributes: Mapping[str, Any],
        error: BaseException | None = None,
    ) -> None:
        """A finished span of a batch of jobs (``headers``: each job's), from ``start_ns`` to now."""
        creations: dict[tuple[int, int], Any] = {}
        for job_headers in headers:
            if job_headers and "traceparent" in job_headers and len(creations) <= MAX_LINKS:
                context = self._propagator.extract(job_headers)
                span_context = trace.get_current_span(context).get_span_context()
                if span_context.is_valid:
                    creations.setdefault((span_context.trace_id, span_context.span_id), span_context)
        contexts = list(creations.values())
        if len(contexts) == 1:
            parent = trace.set_span_in_context(trace.NonRecordingSpan(contexts[0]))
            links = []
        else:
            parent = otel_context.Context()  # a root, whatever the current task carries
            links = [trace.Link(c) for c in contexts[:MAX_LINKS]]
        span = self._tracer.start_span(
            name,
            context=parent,
            kind=trace.SpanKind.INTERNAL,
            links=links,
            attributes={"messaging.system": "shardq", **attributes},
            start_time=start_ns,
        )
        if error is not None:
            span.record_exception(error)
            span.set_status(trace.Status(trace.StatusCode.ERROR, type(error).__name__))
        span.end()


#: The process's job spans (configured once at start from Settings.trace_spans).
spans = _Spans()


def now_ns() -> int:
    """The clock span times are in (the SDK's: Unix epoch nanoseconds)."""
    return time.time_ns()
