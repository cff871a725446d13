"""A concurrency sweep: one scenario for one system at several worker concurrencies, to find the
system's fastest (which its adapter then pins per kind of work).

    python -m bench sweep --system bullmq --work redis --concurrency 10,50,200,1000 [--repeat 2]

Each value runs on a fresh stack, as in a run; with ``--repeat`` the values take turns, so a noisy
minute on a shared machine lands on several values rather than all repeats of one. Prints each
measurement and, per value, the best (drain: the highest jobs/s; instant: the lowest p99 lag).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .infra.postgres import Postgres
from .infra.redis_server import PrivateRedis
from .scenarios import SWEEPABLE, ScenarioContext
from .sizes import Sizes
from .systems import make_systems


@dataclass
class SweepPlan:
    system: str
    scenario: str
    work: str
    concurrencies: list[int]
    repeat: int
    sizes: Sizes
    log_dir: Path
    dispatcher_processes: int


def _headline(scenario: str, figures: dict[str, Any]) -> tuple[float, str]:
    """The figure the sweep ranks by, and the line it prints."""
    if scenario == "drain":
        rate = float(figures["jobs_per_s"])
        capped = " (capped)" if figures.get("capped") else ""
        return rate, f"{rate:10,.0f} jobs/s  {figures['started']:,} started{capped}"
    p99 = float(figures.get("p99_ms", float("inf")))
    return -p99, f"start lag p50 {figures.get('p50_ms', float('nan')):8.1f} ms  p99 {p99:8.1f} ms"


def sweep(plan: SweepPlan) -> dict[int, list[float]]:
    shardq = plan.system.startswith("shardq")
    postgres = Postgres().start() if shardq else None
    ranked: dict[int, list[float]] = {c: [] for c in plan.concurrencies}
    try:
        peers = [] if shardq else [plan.system]
        systems = make_systems(peers, postgres, plan.dispatcher_processes)
        system = next(s for s in systems if s.name == plan.system)
        system.prepare()
        redis = PrivateRedis().start()
        try:
            described = system.describe(redis, plan.log_dir / f"{system.name}.log")
            means = described["settings"].get("worker_concurrency_means", "worker concurrency")
            print(f"{plan.system} {plan.scenario} with {plan.work} work; concurrency = {means}", flush=True)
            for round_ in range(plan.repeat):
                for concurrency in plan.concurrencies:
                    ctx = ScenarioContext(system, redis, plan.sizes, plan.log_dir, plan.work, concurrency)
                    t0 = time.monotonic()
                    try:
                        figures = SWEEPABLE[plan.scenario](ctx).figures
                    except Exception as exc:
                        print(f"  concurrency {concurrency:6}  FAILED: {exc}".splitlines()[0], flush=True)
                        continue
                    rank, line = _headline(plan.scenario, figures)
                    ranked[concurrency].append(rank)
                    took = f"{time.monotonic() - t0:.0f} s, round {round_ + 1}"
                    print(f"  concurrency {concurrency:6}  {line}  ({took})", flush=True)
        finally:
            redis.stop()
    finally:
        if postgres is not None:
            postgres.stop()
    print("best of each:")
    for concurrency, ranks in ranked.items():
        if ranks:
            best = max(ranks)
            shown = f"{best:,.0f} jobs/s" if plan.scenario == "drain" else f"p99 {-best:.1f} ms"
            print(f"  concurrency {concurrency:6}  {shown}  ({len(ranks)} run(s))")
    return ranked
