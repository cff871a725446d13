"""The compressed-month soak, short (``python -m bench soak`` for two minutes and a quarter, retention of
a minute, the shortest the dispatcher accepts): once retention is in steady state the jobs table and
Redis stay flat, the processes' memory does not grow, and every job ran. With retention off the same
run fails (the row count grows with every job), which is what makes this test able to fail.

It judges with the full soak's verdict (each resource's level between the bursts, last third against
second, only growth fails), and what it asserts is chosen for a shared 2-core machine: the DB's size
on disk is not judged (it grows until autovacuum's first passes make the deleted rows' space
reusable, minutes into a run; the full soak judges it), nor latency or the bursts' drain time (one
busy neighbour moves a p99 by a second); the rest is judged with room for noise: rows growing by
less than 25%, Redis by less than 30%, RSS by less than 15%.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.soak.samples import Sample
from bench.soak.verdict import judge
from tests.support.processes import ROOT, _env

ROW_TOLERANCE = 0.25
REDIS_TOLERANCE = 0.30
RSS_GROWTH = 0.15


def run_short_soak(out: Path, retention: str = "1m") -> dict:
    argv = [
        sys.executable, "-m", "bench", "soak", "--minutes", "2.25", "--rate", "116", "--burst-rate", "1000",
        "--burst-seconds", "5", "--burst-every", "30", "--max-delay", "5", "--retention", retention,
        "--sample", "5", "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, env=_env({}), capture_output=True, text=True, timeout=270)
    assert done.returncode in (0, 1), done.stdout + done.stderr  # 1: the full verdict's stricter rules
    return json.loads((out / "soak.json").read_text())


def flatness_failures(results: dict) -> list[str]:
    """The soak's own verdict (``bench.soak.verdict``: each resource's level between bursts, last
    third against second, growth only), with this test's tolerances."""
    samples = [Sample(**s) for s in results["samples"]]
    failures = []
    for tolerance, names in (
        (ROW_TOLERANCE, {"rows"}),
        (REDIS_TOLERANCE, {"redis_bytes"}),
        (RSS_GROWTH, {"dispatcher_rss", "worker_rss"}),
    ):
        checks = judge(samples, tolerance, latency_tolerance=0.5)
        failures += [c.describe() for c in checks if c.name in names and not c.ok]
    return failures


@pytest.mark.timeout(300)
def test_a_short_soak_stays_flat_with_retention(tmp_path: Path) -> None:
    results = run_short_soak(tmp_path)
    figures = results["figures"]
    assert results["all_ran"], figures
    assert figures["jobs_enqueued"] > 20_000, figures
    assert figures["cron_runs"] >= 0.8 * figures["cron_expected"], figures
    assert max(s["prune_per_s"] for s in results["samples"]) > 0, "retention deleted nothing"
    assert flatness_failures(results) == [], results["verdict"]
