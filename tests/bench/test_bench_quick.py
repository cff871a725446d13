"""The benchmark harness runs end to end for shardq alone (quick sizes, no peers) and reports a
number for every scenario. It measures nothing here: the figures are the harness' smoke test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import ROOT, _env

SCENARIOS = ["ingest", "drain", "latency", "delay", "scale", "memory", "drain-redis"]
#: one figure per scenario that must be a positive number
FIGURES = {
    "ingest": [("one_jobs_per_s",), ("pipelined_jobs_per_s",), ("bulk_jobs_per_s",)],
    "drain": [("jobs_per_s",)],
    "drain-redis": [("jobs_per_s",)],
    "latency": [("steady", "p99_ms"), ("burst", "p99_ms"), ("burst", "clear_s")],
    "delay": [("instant", "p99_ms"), ("sequential", "p99_ms")],
    "scale": [("small", "lease_jobs_per_s"), ("large", "lease_jobs_per_s")],
    "memory": [("redis_bytes_per_job",), ("dispatcher_rss_mb",)],
}


def _figure(scenario: dict, path: tuple[str, ...]) -> object:
    for key in path:
        scenario = scenario[key]
    return scenario


@pytest.mark.serial
@pytest.mark.timeout(200)
def test_quick_run_for_shardq_alone_reports_every_scenario(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "bench", "run", "--quick", "--peers", "none", "--out", str(tmp_path)]
    done = subprocess.run(argv, cwd=ROOT, env=_env({}), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    shardq = results["systems"]["shardq"]
    assert shardq["errors"] == {}, shardq["errors"]
    assert sorted(shardq["scenarios"]) == sorted(SCENARIOS)
    for scenario, paths in FIGURES.items():
        for path in paths:
            value = _figure(shardq["scenarios"][scenario], path)
            assert isinstance(value, (int, float)) and value >= 0, (scenario, path, value)
    assert shardq["scenarios"]["drain"]["complete"], shardq["scenarios"]["drain"]
    realistic = shardq["scenarios"]["drain-redis"]
    assert realistic["complete"] and realistic["work"] == "redis", realistic
    assert realistic["redis_round_trips"] >= realistic["started"], realistic  # every handler made its trip
    assert realistic["worker_concurrency"] == shardq["settings"]["worker_concurrency"]["redis"]
    assert results["systems"]["shardq-sqlite"]["scenarios"]["ingest"]["bulk_jobs_per_s"] > 0
    assert results["machine"]["cores"] and results["machine"]["cpu_model"]
    assert (tmp_path / "results.md").read_text().startswith("| scenario | shardq |")
