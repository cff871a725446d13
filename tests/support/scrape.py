"""Reading a dispatcher's /metrics in a test."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def samples(port: int) -> Iterator[Sample]:
    """Every sample the dispatcher (or supervisor) listening on ``port`` exposes now."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for family in text_string_to_metric_families(text):
        yield from family.samples


def metric_total(port: int, name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels``."""
    return sum(s.value for s in samples(port) if s.name == name and labels.items() <= s.labels.items())
