"""Drain: pre-queued no-op jobs run by the worker processes, jobs/s from the first start to the last."""

from __future__ import annotations

from ..records import duplicate_starts, read_starts, start_rate
from .context import Outcome, ScenarioContext


def run(ctx: ScenarioContext) -> Outcome:
    sizes = ctx.sizes
    params = {"jobs": sizes.drain_jobs, "batch": sizes.batch, "processes": sizes.worker_processes,
              "timeout": sizes.timeout_s}  # fmt: skip
    with ctx.stack() as stack:
        result = stack.call("drain", params, sizes.timeout_s + 120)
        starts = read_starts(ctx.redis.client)  # type: ignore[arg-type]
        duplicates = duplicate_starts(ctx.redis.client)  # type: ignore[arg-type]
    return Outcome(
        {
            "jobs": sizes.drain_jobs,
            "started": len(starts),
            "complete": result["complete"] and len(starts) == sizes.drain_jobs,
            "jobs_per_s": start_rate(starts),
            "worker_processes": sizes.worker_processes,
            "duplicate_starts": duplicates,
        }
    )
