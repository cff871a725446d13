"""Steady latency: a steady rate of single enqueues, then a burst through the bulk API.

Per phase: enqueue-to-start p50/p99/max. For the burst also: failed enqueues, the rate the producer
reached, and how long after the burst's last enqueue the last of its jobs started (backlog cleared).
"""

from __future__ import annotations

from ..records import duplicate_starts, in_range, lag_summary, read_starts
from .context import Outcome, ScenarioContext


def run(ctx: ScenarioContext) -> Outcome:
    s = ctx.sizes
    params = {"steady_rate": s.steady_rate, "steady_seconds": s.steady_seconds, "burst_rate": s.burst_rate,
              "burst_seconds": s.burst_seconds, "burst_batch": s.burst_batch,
              "processes": s.worker_processes, "backlog_timeout": s.backlog_timeout_s}  # fmt: skip
    with ctx.stack() as stack:
        result = stack.call("latency", params, s.steady_seconds + s.burst_seconds + s.backlog_timeout_s + 120)
        starts = read_starts(ctx.redis.client)  # type: ignore[arg-type]
        duplicates = duplicate_starts(ctx.redis.client)  # type: ignore[arg-type]
    figures = {"complete": result["complete"], "duplicate_starts": duplicates}
    samples = {}
    for name in ("steady", "burst"):
        phase = result[name]
        mine = in_range(starts, phase)
        span = phase["end"] - phase["start"]
        figures[name] = {
            **lag_summary(mine),
            "sent": phase["sent"],
            "failed": phase["failed"],
            "rate_sent_per_s": phase["sent"] / span if span > 0 else 0.0,
        }
        samples[f"latency {name}"] = [x.lag_ms for x in mine]
    burst = result["burst"]
    burst_starts = in_range(starts, burst)
    if len(burst_starts) >= burst["sent"] - burst["failed"]:
        last_start = max((x.t_started for x in burst_starts), default=burst["end"])
        figures["burst"]["clear_s"] = max(0.0, last_start - burst["end"])
    else:  # the percentiles above then cover only the jobs that started
        figures["burst"]["clear_note"] = f"> {s.backlog_timeout_s:g}"
    return Outcome(figures, samples)
