"""One benchmark run: every chosen scenario for shardq and each chosen peer, back to back.

Systems run one after another, each on its own private redis-server (flushed before every
scenario). A peer that cannot be installed, or a scenario that fails, is recorded with its error
and the run goes on. results.json is rewritten after every scenario, so a run cut short keeps what
it measured; results.md and the plots are written at the end.
"""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .infra.postgres import Postgres
from .infra.redis_server import PrivateRedis
from .machine import machine_info, shardq_source
from .report.markdown import write_markdown
from .report.plots import write_plots
from .scenarios import SCENARIOS, ScenarioContext
from .sizes import Sizes
from .systems import System, make_systems

SAMPLES = "samples.json"  # raw latencies for the plots, kept beside the logs (not committed)


@dataclass
class Plan:
    scenarios: list[str]
    peers: list[str]
    sizes: Sizes
    quick: bool
    out: Path
    dispatcher_processes: int
    command: str


def run(plan: Plan) -> dict[str, Any]:
    plan.out.mkdir(parents=True, exist_ok=True)
    log_dir = plan.out / "tmp"  # git-ignored: logs, SQLite files
    postgres = Postgres().start()
    results: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": plan.command,
        "quick": plan.quick,
        "scenarios": plan.scenarios,
        "sizes": plan.sizes.as_dict(),
        "machine": machine_info(),
        "shardq_source": shardq_source(),
        "systems": {},
    }
    samples: dict[str, dict[str, list[float]]] = {}
    try:
        for system in make_systems(plan.peers, postgres, plan.dispatcher_processes):
            if any(s in system.scenarios for s in plan.scenarios):
                results["systems"][system.name] = entry = {"scenarios": {}, "errors": {}}
                samples[system.name] = {}
                _run_system(system, plan, log_dir, entry, samples[system.name], results)
    finally:
        postgres.stop()
    results["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    (log_dir / SAMPLES).write_text(json.dumps(samples))
    write_reports(plan.out, results, samples)
    return results


def write_reports(out: Path, results: dict[str, Any], samples: dict[str, dict[str, list[float]]]) -> None:
    _write_json(out, results)
    write_markdown(out / "results.md", results)
    results["plots"] = write_plots(out, results, samples)
    _write_json(out, results)


def rewrite(out: Path) -> None:
    """results.md and the plots again from results.json (and the raw latencies, when kept)."""
    write_reports(out, json.loads((out / "results.json").read_text()), _load_samples(out))


def merge(out: Path, other: Path) -> dict[str, Any]:
    """Fold another run's figures (e.g. one scenario measured again) into ``out``'s results: each
    system's scenarios and errors there replace the same ones here; then the reports are rewritten."""
    results = json.loads((out / "results.json").read_text())
    newer = json.loads((other / "results.json").read_text())
    samples = _load_samples(out)
    newer_samples = _load_samples(other)
    for name, system in newer["systems"].items():
        mine = results["systems"].setdefault(name, {"scenarios": {}, "errors": {}})
        for key in ("versions", "settings", "python", "redis_version"):
            if key in system:
                mine[key] = system[key]
        mine.pop("error", None)
        for scenario, figures in system["scenarios"].items():
            mine["scenarios"][scenario] = figures
            mine["errors"].pop(scenario, None)
        mine["errors"].update(system["errors"])
        samples.setdefault(name, {}).update(newer_samples.get(name, {}))
    replaced = {n: sorted(s["scenarios"]) for n, s in newer["systems"].items()}
    results.setdefault("merged", []).append(
        {"command": newer["command"], "started_at": newer["started_at"], "replaced": replaced}
    )
    (out / "tmp").mkdir(exist_ok=True)
    (out / "tmp" / SAMPLES).write_text(json.dumps(samples))
    write_reports(out, results, samples)
    return results


def _load_samples(out: Path) -> dict[str, dict[str, list[float]]]:
    path = out / "tmp" / SAMPLES
    return json.loads(path.read_text()) if path.exists() else {}


def _run_system(
    system: System, plan: Plan, log_dir: Path, entry: dict[str, Any], samples: dict[str, list[float]],
    results: dict[str, Any],
) -> None:  # fmt: skip
    print(f"== {system.name}", flush=True)
    redis = PrivateRedis()
    try:
        system.prepare()
        redis.start()
        entry.update(system.describe(redis, log_dir / f"{system.name}.log"))
        entry["redis_version"] = redis.version()
    except Exception as exc:
        entry["error"] = f"setup failed: {exc}"
        print(f"   setup failed: {exc}", flush=True)
        redis.stop()
        _write_json(plan.out, results)
        return
    try:
        for name in plan.scenarios:
            if name not in system.scenarios:
                continue
            scenario = SCENARIOS[name]
            ctx = ScenarioContext(system, redis, plan.sizes, log_dir, work=scenario.work)
            t0 = time.monotonic()
            try:
                outcome = scenario.run(ctx)
            except Exception as exc:
                entry["errors"][name] = "".join(traceback.format_exception_only(exc)).strip()
                print(f"   {name:14} FAILED: {entry['errors'][name].splitlines()[0]}", flush=True)
            else:
                entry["scenarios"][name] = outcome.figures
                samples.update(outcome.samples)
                took = time.monotonic() - t0
                print(f"   {name:14} {took:6.1f} s  {_headline(outcome.figures)}", flush=True)
            _write_json(plan.out, results)
    finally:
        redis.stop()


def _headline(figures: dict[str, Any]) -> str:
    """The scenario's figures on one line, nested ones flattened."""
    parts = []
    for key, value in figures.items():
        if isinstance(value, dict):
            parts.append(f"{key}: " + " ".join(f"{k}={_fmt(v)}" for k, v in value.items()))
        else:
            parts.append(f"{key}={_fmt(value)}")
    return "; ".join(parts)


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _write_json(out: Path, results: dict[str, Any]) -> None:
    path = out / "results.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    tmp.replace(path)
