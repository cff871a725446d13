"""Delay precision: jobs all due at one instant, then delayed jobs one after another with idle
workers; start lag = start time - due time."""

from __future__ import annotations

from ..records import duplicate_starts, in_range, lag_summary, read_starts
from .context import Outcome, ScenarioContext


def run(ctx: ScenarioContext) -> Outcome:
    s = ctx.sizes
    params = {"instant_jobs": s.instant_jobs, "instant_lead_s": s.instant_lead_s,
              "sequential_jobs": s.sequential_jobs, "sequential_delay_s": s.sequential_delay_s,
              "processes": s.worker_processes, "timeout": s.timeout_s}  # fmt: skip
    with ctx.stack() as stack:
        timeout = s.instant_lead_s + s.timeout_s + s.sequential_jobs * (s.sequential_delay_s + 10) + 120
        result = stack.call("delay", params, timeout)
        starts = read_starts(ctx.redis.client)  # type: ignore[arg-type]
        duplicates = duplicate_starts(ctx.redis.client)  # type: ignore[arg-type]
    figures = {"complete": result["complete"], "duplicate_starts": duplicates}
    samples = {}
    for name in ("instant", "sequential"):
        mine = in_range(starts, result[name])
        figures[name] = lag_summary(mine)
        samples[f"delay {name}"] = [x.lag_ms for x in mine]
    figures["instant"]["enqueued_before_due"] = result["instant"]["enqueued_before_due"]
    figures["sequential"]["delay_s"] = s.sequential_delay_s
    return Outcome(figures, samples)
