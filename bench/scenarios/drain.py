"""Drain: pre-queued jobs run by the worker processes, jobs/s from the first start to the last.

With no-op handlers (``noop`` work) it measures the queue's own cost per job. With handlers that do
work (a Redis round trip, 1 ms of I/O, 100 µs of CPU) it measures what an application's jobs get; a
system slower than the jobs allow is stopped ``drain_work_max_seconds`` after its first start and
measured on the jobs it started by then (``capped``)."""

from __future__ import annotations

from typing import Any

from ..peers._work import COUNT_KEY
from ..records import duplicate_starts, read_starts, start_rate
from .context import Outcome, ScenarioContext


def run(ctx: ScenarioContext) -> Outcome:
    sizes = ctx.sizes
    noop = ctx.work == "noop"
    jobs = sizes.drain_jobs if noop else sizes.drain_work_jobs
    params: dict[str, Any] = {"jobs": jobs, "batch": sizes.batch, "processes": sizes.worker_processes,
                              "timeout": sizes.timeout_s, **ctx.work_params()}  # fmt: skip
    if not noop:
        params["max_seconds"] = sizes.drain_work_max_seconds
    with ctx.stack() as stack:
        result = stack.call("drain", params, sizes.timeout_s + 120)
        starts = read_starts(ctx.redis.client)  # type: ignore[arg-type]
        duplicates = duplicate_starts(ctx.redis.client)  # type: ignore[arg-type]
        round_trips = int(ctx.redis.client.get(COUNT_KEY) or 0)  # type: ignore[union-attr]
    figures = {
        "jobs": jobs,
        "started": len(starts),
        "complete": result["complete"] and len(starts) == jobs,
        "jobs_per_s": start_rate(starts),
        "worker_processes": sizes.worker_processes,
        "duplicate_starts": duplicates,
        "work": result["work"],
        "worker_concurrency": result["worker_concurrency"],
    }
    if not noop:
        figures["capped"] = result["capped"]
        figures["max_seconds"] = sizes.drain_work_max_seconds
    if ctx.work == "redis":
        figures["redis_round_trips"] = round_trips
    return Outcome(figures)
