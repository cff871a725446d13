"""What a scenario gets (the system, its Redis, the sizes) and what it gives back."""

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

    def stack(self):  # type: ignore[no-untyped-def]
        return self.system.stack(self.redis, self.log_dir)


@dataclass
class Outcome:
    figures: dict[str, Any]
    #: raw latencies in ms by name (for CDF plots), not written to results.json
    samples: dict[str, list[float]] = field(default_factory=dict)
