"""The steady clock across processes (shardq_common/clock.py), with real processes and a real Redis.

Deadlines one process writes to Redis another compares with its own steady clock, so processes
must agree on steady time however their host's wall clock stepped before or between their starts.
Each process here anchors on Redis's TIME and reports its steady time together with the host's
boot clock at the same instant, which lets two processes' readings be compared at one instant."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STEP_MS = 10 * 60 * 1000
# Half a round trip (well under a millisecond here) and the rounding to whole ms; the rest is margin
# for a loaded machine. The step is 12,000 times as large.
AGREE_MS = 50

_READ = """
import sys
from shardq_common.clock import anchor_steady, elapsed_ns, steady_ms, wall_ms
from dispatcher.ops.redis_client import anchor_steady_clock_sync, connect_sync

unanchored = steady_ms() - wall_ms()
redis = connect_sync(sys.argv[1])
first = anchor_steady_clock_sync(redis)
again = anchor_steady_clock_sync(redis)
before = steady_ms()
anchor_steady([(elapsed_ns(), 0.0, elapsed_ns())])  # ignored: anchored already
print(first, again, steady_ms() - before < 1000, unanchored, steady_ms(), elapsed_ns())
"""


def read_steady(redis_url: str, offset_ms: int, tmp_path: Path) -> tuple[int, int]:
    """(steady ms, boot clock ns) of a new process whose wall clock is stepped by `offset_ms`."""
    offset_file = tmp_path / "clock-offset"
    offset_file.write_text(str(offset_ms))
    env = {**os.environ, "SHARDQ_TEST_CLOCK_OFFSET_FILE": str(offset_file)}
    done = subprocess.run(
        [sys.executable, "-c", _READ, redis_url],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    first, again, kept, unanchored, steady, boot_ns = done.stdout.split()
    assert (first, again, kept) == ("True", "False", "True"), "anchored more than once"
    assert abs(int(unanchored)) < 1000  # before anchoring: its own wall clock, step included
    return int(steady), int(boot_ns)


@pytest.mark.parametrize("step_ms", [STEP_MS, -STEP_MS, 0], ids=["forward", "backward", "none"])
def test_processes_started_on_either_side_of_a_wall_clock_step_agree_on_steady_time(
    redis_url: str, tmp_path: Path, step_ms: int
) -> None:
    early_steady, early_boot_ns = read_steady(redis_url, 0, tmp_path)
    late_steady, late_boot_ns = read_steady(redis_url, step_ms, tmp_path)
    early_at_late = early_steady + (late_boot_ns - early_boot_ns) // 1_000_000
    assert abs(late_steady - early_at_late) <= AGREE_MS, (
        f"steady clocks {late_steady - early_at_late} ms apart after a {step_ms} ms step"
    )
