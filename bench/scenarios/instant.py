"""Jobs all due at one instant, run by idle workers whose handlers do work (a Redis round trip, 1 ms
of I/O, 100 µs of CPU): start lag = start time - due time. The no-op form is the first half of the
``delay`` scenario."""

from __future__ import annotations

from ..peers._work import COUNT_KEY
from ..records import duplicate_starts, in_range, lag_summary, read_starts
from .context import Outcome, ScenarioContext


def run(ctx: ScenarioContext) -> Outcome:
    s = ctx.sizes
    params = {"instant_jobs": s.instant_jobs, "instant_lead_s": s.instant_lead_s, "sequential_jobs": 0,
              "sequential_delay_s": 0.0, "processes": s.worker_processes, "timeout": s.timeout_s,
              **ctx.work_params()}  # fmt: skip
    with ctx.stack() as stack:
        result = stack.call("delay", params, s.instant_lead_s + s.timeout_s + 120)
        starts = in_range(read_starts(ctx.redis.client), result["instant"])  # type: ignore[arg-type]
        duplicates = duplicate_starts(ctx.redis.client)  # type: ignore[arg-type]
        round_trips = int(ctx.redis.client.get(COUNT_KEY) or 0)  # type: ignore[union-attr]
    figures = {
        **lag_summary(starts),
        "complete": result["complete"] and len(starts) == s.instant_jobs,
        "enqueued_before_due": result["instant"]["enqueued_before_due"],
        "duplicate_starts": duplicates,
        "work": result["work"],
        "worker_concurrency": result["worker_concurrency"],
    }
    if ctx.work == "redis":
        figures["redis_round_trips"] = round_trips
    samples = {f"due at one instant, {ctx.work}": [x.lag_ms for x in starts]}
    return Outcome(figures, samples)
