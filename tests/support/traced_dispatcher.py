"""``python -m tests.support.traced_dispatcher run``: the dispatcher's command in a process with an
OpenTelemetry SDK tracer provider, as ``opentelemetry-instrument`` would set one up, whose exporter
writes each finished span as one JSON line to the file SHARDQ_TEST_SPANS_FILE names (a test reads
them after the spans it waits for have ended)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import IO

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class JsonLinesExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.out: IO[str] = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            self.out.write(span.to_json(indent=None) + "\n")
        return SpanExportResult.SUCCESS


def main() -> int:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(os.environ["SHARDQ_TEST_SPANS_FILE"])))
    trace.set_tracer_provider(provider)
    from dispatcher.cli.daemon import main as dispatcher_main

    return dispatcher_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
