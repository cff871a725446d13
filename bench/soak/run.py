"""The soak's run: the stack, the load, the sampler and the verdict (see the package's docstring)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg

from tests.support.processes import ROOT, _env
from worker_sdk import Client, Schedule

from ..infra.dispatcher import Dispatcher
from ..infra.postgres import Postgres
from ..infra.redis_server import PrivateRedis
from . import samples as report
from . import verdict as judging
from .load import LoadShape, Producer
from .samples import Sample
from .worker import CRON_TYPE

TYPES = [f"soak.t{i}" for i in range(8)]
#: every table and index of shardq's schema, partitions included
#: dead tuples of the jobs table and its partitions, as autovacuum sees them
DEAD_ROWS = (
    "SELECT COALESCE(sum(n_dead_tup), 0) FROM pg_stat_user_tables "
    "WHERE schemaname = current_schema() AND (relname = 'jobs' OR relname LIKE 'jobs\\_%')"
)
DB_BYTES = (
    "SELECT COALESCE(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema() AND c.relkind = 'r'"
)


@dataclass
class SoakPlan:
    minutes: float
    shape: LoadShape
    retention: str  # a duration, or "off"
    sample_s: float
    out: Path
    workers: int = 1
    dispatcher_processes: int = 2
    private_postgres: bool = True
    tolerance: float = 0.10
    latency_tolerance: float = 0.50
    #: the most the run waits for the last delayed jobs to run once the producer stopped
    drain_timeout_s: float = 120.0
    command: str = ""
    notes: list[str] = field(default_factory=list)

    def settings(self) -> dict[str, Any]:
        if self.retention == "off":
            return {"retention_interval": "0"}
        # A pass every few seconds: with the default minute, rows would pile up a minute beyond the
        # period between passes, which is the point of the default (few passes) but not of a soak.
        return {
            "retention_succeeded": self.retention,
            "retention_dead": self.retention,
            "retention_interval": "5s",
        }


class WorkerStats:
    """Reads the lines the worker processes append (bench/soak/worker.py)."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self.offsets = [0] * len(paths)
        self.ran = self.retried = self.cron = 0

    def read(self) -> list[dict[str, Any]]:
        lines = []
        for i, path in enumerate(self.paths):
            if not path.exists():
                continue
            with path.open() as f:
                f.seek(self.offsets[i])
                chunk = f.read()
            complete = chunk[: chunk.rfind("\n") + 1]
            self.offsets[i] += len(complete)
            for text in complete.splitlines():
                line = json.loads(text)
                self.ran += line["ran"]
                self.retried += line["retried"]
                self.cron += line["cron"]
                lines.append(line)
        return lines


def _pending(redis_server: PrivateRedis) -> int:
    """Jobs delayed, ready or leased in every shard (the counts hashes), the schedule's included."""
    r = redis_server.client
    assert r is not None
    total = 0
    for key in r.scan_iter(match="shardq:{s*}:counts", count=1000):
        for name, value in r.hgetall(key).items():
            if name.decode().rsplit("|", 1)[1] in ("delayed", "ready", "leased"):
                total += int(value)
    return total


def _rss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += psutil.Process(pid).memory_info().rss
    return total


def _weighted(lines: list[dict[str, Any]], key: str) -> float | None:
    """p50 weighted by each worker's starts; for p99 the worst worker's (a p99 of p99s is not one)."""
    seen = [(line[key], line["started"]) for line in lines if line[key] is not None]
    if not seen:
        return None
    if key == "p99_ms":
        return max(v for v, _ in seen)
    return sum(v * n for v, n in seen) / max(1, sum(n for _, n in seen))


def run(plan: SoakPlan, log=print) -> dict[str, Any]:  # noqa: ANN001
    plan.out.mkdir(parents=True, exist_ok=True)
    logs = plan.out / "logs"
    redis_server = PrivateRedis().start()
    # A server of its own: on a shared one, autovacuum's few workers may spend the run on other
    # databases' tables (seen: none reached the soak's in 10 minutes), and the table grows for that.
    postgres = Postgres(private=plan.private_postgres).start()
    database = postgres.new_database()
    dispatcher = Dispatcher(
        redis_server.url, database.url, logs, plan.dispatcher_processes, **plan.settings()
    )
    workers: list[subprocess.Popen[bytes]] = []
    producer: Producer | None = None
    try:
        dispatcher.start()
        stat_paths = [logs / f"worker-{i}.jsonl" for i in range(plan.workers)]
        for i, path in enumerate(stat_paths):
            command = [
                sys.executable, "-m", "bench.soak.worker", "--target", dispatcher.target,
                "--types", ",".join(TYPES), "--window", str(plan.sample_s), "--out", str(path),
            ]  # fmt: skip
            workers.append(
                subprocess.Popen(
                    command,
                    cwd=ROOT,
                    env=_env({}),
                    stdout=open(logs / f"worker-{i}.log", "wb"),  # noqa: SIM115
                    stderr=subprocess.STDOUT,
                )  # fmt: skip
            )
        stats = WorkerStats(stat_paths)
        with Client(dispatcher.target, timeout=10) as client:
            client.upsert_schedule(Schedule(name="soak-every-second", cron="* * * * * *", job_type=CRON_TYPE))
        producer = Producer(dispatcher.target, TYPES, plan.shape)
        producer.start()
        began = time.monotonic()
        collected = _sample_loop(
            plan, began, database.url, redis_server, dispatcher, workers, stats, producer, log
        )
        producer.stop.set()
        producer.join(timeout=30)
        cron_stopped = time.monotonic()
        with Client(dispatcher.target, timeout=10) as client:
            client.pause_schedule("soak-every-second")
        deadline = time.monotonic() + plan.drain_timeout_s
        while _pending(redis_server) and time.monotonic() < deadline:
            time.sleep(min(plan.sample_s, 2.0))
            stats.read()
        left = _pending(redis_server)
        time.sleep(plan.sample_s + 0.5)  # the workers' last window
        stats.read()
        cron_expected = int(cron_stopped - began)
    finally:
        if producer is not None:
            producer.stop.set()
        for w in workers:
            w.terminate()
        for w in workers:
            try:
                w.wait(timeout=15)
            except subprocess.TimeoutExpired:
                w.kill()
        dispatcher.stop()
        database.drop()
        postgres.stop()
        redis_server.stop()
    return _verdict(plan, collected, producer, stats, cron_expected, left, log)


def _sample_loop(plan, began, db_url, redis_server, dispatcher, workers, stats, producer, log):  # noqa: ANN001, PLR0913
    collected: list[Sample] = []
    end = began + plan.minutes * 60
    last_t, last_sent, last_pruned = 0.0, 0, 0
    with psycopg.connect(db_url, autocommit=True) as conn:
        next_at = began + plan.sample_s
        log(" ".join(report.table([])[0].split("|")[1:-1]))
        while next_at <= end + 0.01:
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += plan.sample_s
            t = time.monotonic() - began
            lines = stats.read()
            rows = int(conn.execute("SELECT count(*) FROM jobs").fetchone()[0])  # type: ignore[index]
            db_bytes = int(conn.execute(DB_BYTES).fetchone()[0])  # type: ignore[index]
            dead_rows = int(conn.execute(DEAD_ROWS).fetchone()[0])  # type: ignore[index]
            # Every job created and no longer a row was deleted by retention (whether by a DELETE or
            # a dropped partition): the producer's and the schedule's jobs, less the rows left.
            sent = producer.sent
            pruned = max(last_pruned, sent + stats.cron - rows)
            dt = t - last_t
            sample = Sample(
                t=round(t, 1),
                db_bytes=db_bytes,
                rows=rows,
                dead_rows=dead_rows,
                redis_bytes=redis_server.used_memory(),
                dispatcher_rss=dispatcher.rss_bytes(),
                worker_rss=_rss([w.pid for w in workers]),
                p50_ms=_weighted(lines, "p50_ms"),
                p99_ms=_weighted(lines, "p99_ms"),
                ingest_per_s=(sent - last_sent) / dt,
                drain_per_s=sum(n["ran"] + n["retried"] + n["cron"] for n in lines) / plan.sample_s,
                prune_per_s=(pruned - last_pruned) / dt,
            )
            collected.append(sample)
            log(report.table([sample])[2])
            last_t, last_sent, last_pruned = t, sent, pruned
    return collected


def _verdict(plan, collected, producer, stats, cron_expected, left, log) -> dict[str, Any]:  # noqa: ANN001
    checks = judging.judge(collected, plan.tolerance, plan.latency_tolerance)
    # Every job ran: none is left in Redis (delayed, ready or leased) once the load stopped, and the
    # handlers started at least as many as were enqueued. First attempts alone may count fewer: a
    # lease handed back unstarted (a link retired under load) makes the job's first start attempt 2.
    all_ran = left == 0 and stats.ran + stats.retried >= producer.sent
    ok = all(c.ok for c in checks) and all_ran and len(collected) >= 6
    figures = {
        "jobs_enqueued": producer.sent,
        "jobs_ran": stats.ran,
        "jobs_left_in_redis": left,
        "retries": stats.retried,
        "cron_runs": stats.cron,
        "cron_expected": cron_expected,
        "enqueue_errors": producer.errors,
        "offered_but_dropped": producer.dropped,
        "peak_rows": max(s.rows for s in collected),
        "peak_ingest_per_s": max(s.ingest_per_s for s in collected),
    }
    verdict = judging.verdict_line(checks, all_ran, producer.sent, left, len(collected) >= 6)
    title = (
        f"shardq soak: {plan.minutes:g} min, {plan.shape.rate:g} jobs/s "
        f"+ bursts of {plan.shape.burst_rate:g}/s for {plan.shape.burst_seconds:g} s "
        f"every {plan.shape.burst_every:g} s, retention {plan.retention}"
    )
    note = report.plot(plan.out / "soak.png", collected, title)
    report.write_csv(plan.out / "samples.csv", collected)
    md = [
        f"# {title}",
        "",
        f"`{plan.command}`" if plan.command else "",
        "",
        verdict,
        "",
        *judging.thirds_table(checks),
        "",
        *judging.bursts_table(collected),
        "",
        "| figure | value |",
        "| --- | ---: |",
        *(f"| {k} | {v:,.0f} |" for k, v in figures.items()),
        "",
        *report.table(collected),
        "",
    ]
    (plan.out / "soak.md").write_text("\n".join(md))
    results = {
        "ok": ok,
        "verdict": verdict,
        "all_ran": all_ran,
        "checks": [asdict(c) for c in checks],
        "figures": figures,
        "samples": [asdict(s) for s in collected],
        "plan": {"minutes": plan.minutes, "retention": plan.retention, "shape": asdict(plan.shape)},
    }
    (plan.out / "soak.json").write_text(json.dumps(results, indent=1))
    for line in judging.thirds_table(checks):
        log(line)
    log(", ".join(f"{k} {v:,.0f}" for k, v in figures.items()))
    if note:
        log(note)
    log(verdict)
    return results
