"""One module per scenario; each ``run(ctx)`` returns its figures and the raw samples for plots.

A scenario is one of those modules with the work its handlers do: ``drain`` runs no-op jobs,
``drain-redis`` the same drain with jobs that each make a Redis round trip (bench.peers._work)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..systems import WORK_KINDS
from . import delay, drain, ingest, instant, latency, memory_per_job, scale
from .context import Outcome, ScenarioContext


@dataclass(frozen=True)
class Scenario:
    run: Callable[[ScenarioContext], Outcome]
    work: str = "noop"


SCENARIOS: dict[str, Scenario] = {
    "ingest": Scenario(ingest.run),
    "drain": Scenario(drain.run),
    "latency": Scenario(latency.run),
    "delay": Scenario(delay.run),
    "scale": Scenario(scale.run),
    "memory": Scenario(memory_per_job.run),
    **{f"drain-{work}": Scenario(drain.run, work) for work in WORK_KINDS},
    **{f"instant-{work}": Scenario(instant.run, work) for work in WORK_KINDS},
}
#: the scenarios whose workers' concurrency ``python -m bench sweep`` varies, for any kind of work
SWEEPABLE: dict[str, Callable[[ScenarioContext], Outcome]] = {"drain": drain.run, "instant": instant.run}

__all__ = ["SCENARIOS", "SWEEPABLE", "WORK_KINDS", "Outcome", "Scenario", "ScenarioContext"]
