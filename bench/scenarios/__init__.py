"""One module per scenario; each ``run(ctx)`` returns its figures and the raw samples for plots."""

from __future__ import annotations

from collections.abc import Callable

from . import delay, drain, ingest, latency, memory_per_job, scale
from .context import Outcome, ScenarioContext

SCENARIOS: dict[str, Callable[[ScenarioContext], Outcome]] = {
    "ingest": ingest.run,
    "drain": drain.run,
    "latency": latency.run,
    "delay": delay.run,
    "scale": scale.run,
    "memory": memory_per_job.run,
}

__all__ = ["SCENARIOS", "Outcome", "ScenarioContext"]
