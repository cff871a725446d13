"""This process's cumulative job counters and enqueue-to-start histogram, read back from the metric
instruments, for the Stats RPC (a dashboard takes rates from the difference of two samples)."""

from __future__ import annotations

from collections import defaultdict

from prometheus_client import Counter, Histogram

from shardq_common.clock import wall_ms

from . import metrics

#: When this process began counting: a sample with another start means the counters began anew.
STARTED_AT_MS = wall_ms()

#: The counters a TypeCounters message carries, by its field name.
COUNTERS: dict[str, Counter] = {
    "enqueued": metrics.ENQUEUED,
    "started": metrics.LEASED,
    "succeeded": metrics.ACKED,
    "failed": metrics.NACKED,
    "dead_lettered": metrics.DEAD,
}


def _totals(counter: Counter) -> dict[str, int]:
    by_type: dict[str, int] = defaultdict(int)
    for family in counter.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                by_type[sample.labels["type"]] += int(sample.value)
    return by_type


def type_counters() -> dict[str, dict[str, int]]:
    """type -> {field name -> count} for every type this process counted anything of."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(COUNTERS, 0))
    for field, counter in COUNTERS.items():
        for job_type, n in _totals(counter).items():
            out[job_type][field] = n
    return dict(out)


def latency_histogram(histogram: Histogram = metrics.ENQUEUE_TO_START) -> tuple[list[float], list[int]]:
    """(bucket bounds in seconds, cumulative counts with +Inf last), every label set summed."""
    counts: dict[float, int] = defaultdict(int)
    for family in histogram.collect():
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                counts[float(sample.labels["le"])] += int(sample.value)
    bounds = [float(b) for b in metrics.LATENCY_BUCKETS]
    return bounds, [counts.get(b, 0) for b in bounds] + [counts.get(float("inf"), 0)]
