"""The rows of the results table: where each figure is in results.json and which way is better."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..sizes import Sizes

#: what a realistic row's handlers do, as its label says it
WORK_LABELS = {
    "redis": "one Redis round trip (INCR+SET) per job",
    "io1ms": "1 ms of I/O wait per job",
    "cpu100us": "~100 µs of CPU per job",
}


@dataclass(frozen=True)
class Row:
    label: str
    scenario: str
    path: tuple[str, ...]
    #: "higher" or "lower" is better; "" for counts that take no ratio
    better: str
    digits: int = 0
    #: where a text stands in for a figure that could not be measured (e.g. "> 120")
    note_path: tuple[str, ...] = ()

    def value(self, system: dict[str, Any]) -> float | None:
        node = _find(system, self.scenario, self.path)
        return float(node) if isinstance(node, (int, float)) and not isinstance(node, bool) else None

    def note(self, system: dict[str, Any]) -> str | None:
        node = _find(system, self.scenario, self.note_path) if self.note_path else None
        return node if isinstance(node, str) else None


def _find(system: dict[str, Any], scenario: str, path: tuple[str, ...]) -> Any:
    node: Any = system.get("scenarios", {}).get(scenario)
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def table_rows(sizes: dict[str, Any]) -> list[Row]:
    """The no-op rows (the queue's own cost per job), then the realistic ones (what jobs that do some
    work get). A run from before a size existed is labelled with today's default for it."""
    sizes = {**Sizes().as_dict(), **sizes}
    n = "{:,}".format
    steady = f"steady {sizes['steady_rate']:g}/s"
    one = f"ingest one at a time, {n(sizes['ingest_one_jobs'])} jobs or {sizes['ingest_max_seconds']:g} s"
    burst = f"burst {n(int(sizes['burst_rate']))}/s"
    return [
        Row(f"{one} (jobs/s)", "ingest", ("one_jobs_per_s",), "higher"),
        Row("ingest one job per call, 64 calls in flight (jobs/s)", "ingest", ("pipelined_jobs_per_s",),
            "higher"),
        Row(f"ingest bulk, batches of {n(sizes['batch'])} (jobs/s)", "ingest", ("bulk_jobs_per_s",),
            "higher"),
        Row(f"drain {n(sizes['drain_jobs'])} no-op jobs, {sizes['worker_processes']} worker processes "
            "(jobs/s)", "drain", ("jobs_per_s",), "higher"),
        Row(f"{steady}: enqueue→start p50 (ms)", "latency", ("steady", "p50_ms"), "lower", 1),
        Row(f"{steady}: p99 (ms)", "latency", ("steady", "p99_ms"), "lower", 1),
        Row(f"{steady}: max (ms)", "latency", ("steady", "max_ms"), "lower", 1),
        Row(f"{burst}: rate the producer reached (jobs/s)", "latency", ("burst", "rate_sent_per_s"),
            "higher"),
        Row(f"{burst}: enqueue→start p50 (ms)", "latency", ("burst", "p50_ms"), "lower", 1),
        Row(f"{burst}: p99 (ms)", "latency", ("burst", "p99_ms"), "lower", 1),
        Row(f"{burst}: max (ms)", "latency", ("burst", "max_ms"), "lower", 1),
        Row(f"{burst}: failed enqueues", "latency", ("burst", "failed"), ""),
        Row(f"{burst}: backlog cleared after the burst (s)", "latency", ("burst", "clear_s"), "lower", 2,
            ("burst", "clear_note")),
        Row(f"{n(sizes['instant_jobs'])} no-op jobs due at one instant: start lag p50 (ms)", "delay",
            ("instant", "p50_ms"), "lower", 1),
        Row("… p99 (ms)", "delay", ("instant", "p99_ms"), "lower", 1),
        Row("… max (ms)", "delay", ("instant", "max_ms"), "lower", 1),
        Row(f"{sizes['sequential_jobs']} delayed one after another, idle workers: lag p50 (ms)", "delay",
            ("sequential", "p50_ms"), "lower", 1),
        Row("… p99 (ms)", "delay", ("sequential", "p99_ms"), "lower", 1),
        Row("… max (ms)", "delay", ("sequential", "max_ms"), "lower", 1),
        Row(f"lease throughput, {n(sizes['scale_small_pending'])} pending (jobs/s)", "scale",
            ("small", "lease_jobs_per_s"), "higher"),
        Row(f"lease throughput, {n(sizes['scale_large_pending'])} pending (jobs/s)", "scale",
            ("large", "lease_jobs_per_s"), "higher"),
        Row("lease throughput, large / small pending", "scale", ("ratio_large_small",), "higher", 2),
        Row("Redis used_memory per pending small job (bytes)", "memory", ("redis_bytes_per_job",), "lower"),
        Row(f"dispatcher RSS at {n(sizes['memory_pending'])} pending (MB)", "memory", ("dispatcher_rss_mb",),
            "lower"),
        *_realistic_rows(sizes),
    ]  # fmt: skip


def _realistic_rows(sizes: dict[str, Any]) -> list[Row]:
    n = "{:,}".format
    drain = f"drain {n(sizes['drain_work_jobs'])} jobs or {sizes['drain_work_max_seconds']:g} s"
    instant = f"{n(sizes['instant_jobs'])} due at one instant"
    rows = [Row(f"{drain}, {label} (jobs/s)", f"drain-{work}", ("jobs_per_s",), "higher")
            for work, label in WORK_LABELS.items()]  # fmt: skip
    for work, label in WORK_LABELS.items():
        scenario = f"instant-{work}"
        rows.append(Row(f"{instant}, {label}: start lag p50 (ms)", scenario, ("p50_ms",), "lower", 1))
        rows.append(Row("… p99 (ms)", scenario, ("p99_ms",), "lower", 1))
    return rows
