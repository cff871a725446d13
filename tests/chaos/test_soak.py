"""The chaos soak: a short variant in the default suite, the full one (50,000 jobs) marked slow.

Replay a failure with the seed the plan printed: python -m tests.chaos.soak --seed N --jobs ...
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tests.support.pg_cluster import find_pg_bin

from .plan import make_plan
from .soak import Soak

pytestmark = pytest.mark.skipif(find_pg_bin() is None, reason="needs PostgreSQL server binaries")


def _seed() -> int:
    return int(os.environ.get("SHARDQ_SOAK_SEED") or random.randrange(1_000_000))


def _run(tmp_path: Path, jobs: int, duration: float) -> None:
    plan = make_plan(_seed(), jobs=jobs, duration=duration)
    verdict = Soak(plan, tmp_path).run()
    print(verdict.line())
    assert verdict.ok, "\n".join([plan.describe(), *verdict.problems[:30], verdict.line()])


@pytest.mark.serial
@pytest.mark.timeout(420)
def test_short_soak(tmp_path: Path) -> None:
    _run(tmp_path, jobs=3_000, duration=45)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_full_soak(tmp_path: Path) -> None:
    _run(tmp_path, jobs=50_000, duration=150)
