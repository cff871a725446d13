"""What a scenario gets (the system, its Redis, the sizes, the handlers' work) and what it gives back."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..infra.redis_server import PrivateRedis
from ..sizes import Sizes
from ..systems import System


@dataclass
class ScenarioContext:
    system: System
    redis: PrivateRedis
    sizes: Sizes
    log_dir: Path
    #: what each job's handler does (bench.peers._work.KINDS)
    work: str = "noop"
    #: the workers' concurrency; None: the system's pinned one for ``work``
    concurrency: int | None = None

    def stack(self):  # type: ignore[no-untyped-def]
        return self.system.stack(self.redis, self.log_dir)

    def work_params(self) -> dict[str, Any]:
        """What a driver action is told about the handlers' work."""
        params: dict[str, Any] = {"work": self.work}
        if self.concurrency is not None:
            params["concurrency"] = self.concurrency
        return params


@dataclass
class Outcome:
    figures: dict[str, Any]
    #: raw latencies in ms by name (for CDF plots), not written to results.json
    samples: dict[str, list[float]] = field(default_factory=dict)
