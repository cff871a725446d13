"""OpenTelemetry spans of this test process, kept in memory: the SDK's tracer provider is set once a
process (the API refuses to replace it), so every test module that reads spans shares it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class _WhileActive(SimpleSpanProcessor):
    """Exports only while a test that reads spans runs: the provider stays set for the rest of the
    session, whose other tests should not fill the exporter."""

    active = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.active:
            super().on_end(span)


_installed: tuple[_WhileActive, InMemorySpanExporter] | None = None


def _provider() -> tuple[_WhileActive, InMemorySpanExporter]:
    global _installed
    if _installed is None:
        exporter = InMemorySpanExporter()
        processor = _WhileActive(exporter)
        provider = TracerProvider()
        provider.add_span_processor(processor)
        trace.set_tracer_provider(provider)
        _installed = processor, exporter
    return _installed


@contextmanager
def captured_spans() -> Iterator[InMemorySpanExporter]:
    """The spans that end in this process inside the block (and only those)."""
    processor, exporter = _provider()
    exporter.clear()
    processor.active = True
    try:
        yield exporter
    finally:
        processor.active = False
        exporter.clear()
