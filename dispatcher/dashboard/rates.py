"""Rates and latency percentiles from the dispatchers' cumulative counters (pure arithmetic).

Each dispatcher process counts what it did itself since it started; a sample holds every process's
counters at one moment. A rate is the growth between two samples of the processes present in both
with the same start (a restarted process begins anew and sits out one interval), per second.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from worker_sdk import StatsSnapshot

RATE_FIELDS = ("enqueued", "started", "succeeded", "failed", "dead_lettered")
PERCENTILES = (0.5, 0.95, 0.99)
#: The latency percentiles cover this much of the recent past.
LATENCY_WINDOW_MS = 60_000


@dataclass(frozen=True)
class ProcessCounts:
    started_at_ms: int
    totals: Mapping[str, int]  # rate field -> count, every type summed
    latency_counts: tuple[int, ...]


@dataclass(frozen=True)
class Sample:
    at_ms: int
    processes: Mapping[str, ProcessCounts]  # dispatcher id -> its counts
    latency_bounds_s: tuple[float, ...]


def sample_of(snapshots: Iterable[StatsSnapshot], at_ms: int) -> Sample:
    processes: dict[str, ProcessCounts] = {}
    bounds: tuple[float, ...] = ()
    for snap in snapshots:
        totals = dict.fromkeys(RATE_FIELDS, 0)
        for counters in snap.counters.values():
            for name in RATE_FIELDS:
                totals[name] += getattr(counters, name)
        processes[snap.dispatcher_id] = ProcessCounts(snap.started_at_ms, totals, snap.latency_counts)
        bounds = bounds or snap.latency_bounds_s
    return Sample(at_ms, processes, bounds)


def _growth(old: Sample, new: Sample) -> tuple[dict[str, int], list[int]]:
    grown = dict.fromkeys(RATE_FIELDS, 0)
    latency: list[int] = []
    for member, now in new.processes.items():
        before = old.processes.get(member)
        if before is None or before.started_at_ms != now.started_at_ms:
            continue
        for name in RATE_FIELDS:
            grown[name] += max(0, now.totals[name] - before.totals[name])
        if len(before.latency_counts) == len(now.latency_counts):
            diff = [max(0, b - a) for a, b in zip(before.latency_counts, now.latency_counts, strict=True)]
            latency = [x + y for x, y in zip(latency, diff, strict=True)] if latency else diff
    return grown, latency


def rates(old: Sample, new: Sample) -> dict[str, float]:
    """Per second, between two samples."""
    seconds = max(0.001, (new.at_ms - old.at_ms) / 1000)
    grown, _ = _growth(old, new)
    return {name: round(n / seconds, 2) for name, n in grown.items()}


def percentile(bounds_s: tuple[float, ...], cumulative: list[int], q: float) -> float | None:
    """The q-quantile in seconds of a cumulative histogram, linear within its bucket; None without
    observations; the last finite bound when it falls in +Inf."""
    if not cumulative or cumulative[-1] == 0:
        return None
    rank = q * cumulative[-1]
    lower_bound, lower_count = 0.0, 0
    for bound, count in zip(bounds_s, cumulative, strict=False):
        if count >= rank:
            inside = count - lower_count
            fraction = (rank - lower_count) / inside if inside else 1.0
            return lower_bound + (bound - lower_bound) * fraction
        lower_bound, lower_count = bound, count
    return bounds_s[-1] if bounds_s else None


class Window:
    """The recent samples: rates from the last two, latency percentiles over LATENCY_WINDOW_MS."""

    def __init__(self, span_ms: int = LATENCY_WINDOW_MS) -> None:
        self.span_ms = span_ms
        self.samples: deque[Sample] = deque()

    def add(self, sample: Sample) -> dict[str, object]:
        self.samples.append(sample)
        while len(self.samples) > 2 and sample.at_ms - self.samples[1].at_ms >= self.span_ms:
            self.samples.popleft()
        point: dict[str, object] = {"t": sample.at_ms / 1000}
        if len(self.samples) < 2:
            point["rates"] = dict.fromkeys(RATE_FIELDS, 0.0)
            point["latency_s"] = dict.fromkeys(_names(), None)
            return point
        point["rates"] = rates(self.samples[-2], sample)
        _, latency = _growth(self.samples[0], sample)
        point["latency_s"] = {
            name: percentile(sample.latency_bounds_s, latency, q)
            for name, q in zip(_names(), PERCENTILES, strict=True)
        }
        return point


def _names() -> list[str]:
    return [f"p{int(q * 100)}" for q in PERCENTILES]
