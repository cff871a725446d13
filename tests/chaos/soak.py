"""The chaos soak: a supervisor of dispatcher processes, worker processes, a seeded fault plan, and
a checker over the ledger and the DB. Runs as a test (tests/chaos/test_soak.py) or by hand:

    python -m tests.chaos.soak [--seed N] [--jobs 50000] [--duration 120]

It prints the fault plan first (so a failure can be replayed with its seed) and a one-line verdict
with the figures last; exit 0 when every check held.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import psycopg

from dispatcher.queue.ids import time_of
from tests.support.pg_cluster import PgCluster
from tests.support.processes import ROOT, DispatcherProcess, WorkerProcess, read_ledger
from tests.support.redis_server import RedisServer
from tests.support.wait import wait_until
from worker_sdk import Client, Schedule, ShardqError

from .checker import Verdict, check
from .plan import ALL_TYPES, CRON_TYPE, Fault, SoakPlan, make_plan

ENQUEUE_BATCH = 250
SETTINGS = {
    "shard_count": 32,
    "ownership_ttl_ms": 3000,
    "reconnect_grace_ms": 1000,
    "reconcile_interval_s": 30,
    "metrics_listen": "",
    "log_level": "warning",
}


class Soak:
    def __init__(self, plan: SoakPlan, workdir: Path, log=print) -> None:  # noqa: ANN001
        self.plan = plan
        self.workdir = workdir
        self.log = log
        self.ledger = workdir / "ledger.jsonl"
        self.ids: dict[int, str] = {}
        self.fault_times: list[tuple[float, Fault]] = []
        self.killed_pids: dict[int, float] = {}
        self.enqueue_errors = 0

    def run(self) -> Verdict:
        self.log(self.plan.describe())
        redis = RedisServer(data_dir=self.workdir / "redis")
        pg = PgCluster()
        supervisor: DispatcherProcess | None = None
        workers: list[WorkerProcess] = []
        try:
            redis.start()
            pg.start()
            supervisor = DispatcherProcess(
                redis.url, pg.url, self.workdir, processes=self.plan.dispatchers, **SETTINGS
            ).start(timeout=60)
            self.supervisor = supervisor
            wait_until(lambda: len(self._children()) == self.plan.dispatchers, timeout=30)
            workers = [self._worker(supervisor.target) for _ in range(self.plan.workers)]
            with Client(supervisor.target, timeout=10) as client:
                client.upsert_schedule(Schedule(name="soak-cron", cron="* * * * * *", job_type=CRON_TYPE))
            enqueuer = threading.Thread(target=self._enqueue_all, args=(supervisor.target,), daemon=True)
            enqueuer.start()
            self._inject_faults(supervisor, workers, redis, pg)
            enqueuer.join(timeout=120)
            with Client(supervisor.target, timeout=10) as client:
                _retrying(lambda: client.pause_schedule("soak-cron"))
            wait_until(
                lambda: self._all_finished(pg.url),
                timeout=180,
                interval=1.0,
                message=lambda: f"jobs still unfinished: {self._unfinished(pg.url)}",
            )
            rows, cron_runs = self._read_db(pg.url)
            verdict = check(
                self.plan,
                self.ids,
                rows,
                read_ledger(self.ledger),
                self.fault_times,
                self.killed_pids,
                cron_runs,
            )
            verdict.figures["enqueue_retries"] = self.enqueue_errors
            return verdict
        finally:
            if os.environ.get("SHARDQ_SOAK_DUMP"):  # the evidence, for a failed run
                with contextlib.suppress(Exception):
                    self._dump(pg.url)
            for w in workers:
                w.kill()
            if supervisor is not None:
                supervisor.kill()
                for child in self._children():
                    with contextlib.suppress(psutil.NoSuchProcess):
                        child.kill()
            redis.kill()
            pg.destroy()

    # -- the parts -----------------------------------------------------------------------

    def _worker(self, target: str) -> WorkerProcess:
        return WorkerProcess(
            target,
            self.ledger,
            self.workdir,
            types=",".join(ALL_TYPES),
            concurrency=self.plan.concurrency,
            job_timeout=self.plan.job_timeout,
        ).start()

    def _children(self) -> list[psutil.Process]:
        proc = self.supervisor.process
        if proc is None or proc.poll() is not None:
            return []
        try:
            return [
                c
                for c in psutil.Process(proc.pid).children()
                if "dispatcher.cli.daemon" in " ".join(c.cmdline())
            ]
        except psutil.NoSuchProcess:
            return []

    def _enqueue_all(self, target: str) -> None:
        """Batches with idempotency keys, retried until OK: a call that failed (UNAVAILABLE while
        Redis or the DB restarts) may be sent again without creating a job twice."""
        jobs = self.plan.jobs
        pace = self.plan.duration * 0.6 / max(1, len(jobs) / ENQUEUE_BATCH)
        with Client(target, timeout=10) as client:
            for start in range(0, len(jobs), ENQUEUE_BATCH):
                batch = jobs[start : start + ENQUEUE_BATCH]
                specs = [
                    {
                        "type": j.type,
                        "payload": j.payload,
                        "priority": j.priority,
                        "delay": j.delay,
                        "idempotency_key": f"soak-{self.plan.seed}-{j.index}",
                    }
                    for j in batch
                ]
                began = time.monotonic()
                while True:
                    try:
                        got = client.enqueue_many(specs)
                        break
                    except ShardqError:
                        self.enqueue_errors += 1
                        time.sleep(0.5)
                for job, job_id in zip(batch, got, strict=True):
                    self.ids[job.index] = job_id
                time.sleep(max(0.0, pace - (time.monotonic() - began)))

    def _inject_faults(
        self, supervisor: DispatcherProcess, workers: list[WorkerProcess], redis: RedisServer, pg: PgCluster
    ) -> None:
        started = time.monotonic()
        for fault in self.plan.faults:
            time.sleep(max(0.0, fault.at - (time.monotonic() - started)))
            self.fault_times.append((time.time(), fault))
            self.log(f"  inject {fault}")
            if fault.kind == "worker-kill":
                victim = workers[fault.target]
                assert victim.process is not None
                self.killed_pids[victim.process.pid] = time.time()
                victim.kill()
                workers[fault.target] = self._worker(supervisor.target)
            elif fault.kind == "dispatcher-kill":
                children = self._children()
                if children:
                    children[fault.target % len(children)].send_signal(signal.SIGKILL)
            elif fault.kind == "dispatcher-stop":
                children = self._children()
                if children:
                    child = children[fault.target % len(children)]
                    child.send_signal(signal.SIGSTOP)
                    time.sleep(fault.duration)
                    child.send_signal(signal.SIGCONT)
            elif fault.kind == "redis-restart":
                redis.kill()
                redis.start()  # no persistence: every key is gone
            elif fault.kind == "pg-restart":
                pg.restart(mode="immediate")
            elif fault.kind == "rebalance":
                result = subprocess.run(
                    [sys.executable, "-m", "dispatcher.cli.ctl", "--target", supervisor.target, "rebalance"],
                    capture_output=True,
                    text=True,
                    cwd=ROOT,
                    timeout=60,
                )
                self.log(f"    rebalance exit {result.returncode}: {result.stdout.splitlines()[:1]}")
        time.sleep(max(0.0, self.plan.duration - (time.monotonic() - started)))

    def _unfinished(self, url: str) -> int:
        try:
            with psycopg.connect(url, connect_timeout=3) as conn:
                row = conn.execute(
                    "SELECT COUNT(*) FROM jobs WHERE status NOT IN ('succeeded', 'dead', 'cancelled')"
                ).fetchone()
            return int(row[0]) if row else -1
        except psycopg.OperationalError:
            return -1

    def _all_finished(self, url: str) -> bool:
        return len(self.ids) == len(self.plan.jobs) and self._unfinished(url) == 0

    def _read_db(self, url: str) -> tuple[dict[str, tuple[str, int, int, int]], list[int]]:
        with psycopg.connect(url, connect_timeout=5) as conn:
            rows = conn.execute("SELECT id, status, attempts, failures, expirations FROM jobs").fetchall()
            cron = conn.execute("SELECT id FROM jobs WHERE schedule = 'soak-cron'").fetchall()
        # An occurrence's time is in its job id (run_at moves when a run is retried).
        return {r[0]: (r[1], r[2], r[3], r[4]) for r in rows}, [time_of(r[0]) for r in cron]

    def _dump(self, url: str) -> None:
        out = Path(os.environ["SHARDQ_SOAK_DUMP"])
        out.mkdir(parents=True, exist_ok=True)
        with psycopg.connect(url, connect_timeout=5) as conn:
            rows = conn.execute(
                "SELECT id, type, status, run_at, attempts, failures, expirations, schedule, "
                "schedule_version, enqueued_at, started_at, finished_at FROM jobs ORDER BY id"
            ).fetchall()
        (out / "jobs.tsv").write_text("\n".join("\t".join(map(str, r)) for r in rows))
        (out / "ledger.jsonl").write_text(self.ledger.read_text())
        (out / "faults.txt").write_text("\n".join(f"{t:.3f} {f}" for t, f in self.fault_times))
        for log in self.workdir.glob("*.log"):
            (out / log.name).write_text(log.read_text(errors="replace"))


def _retrying(call, attempts: int = 20) -> None:  # noqa: ANN001
    for i in range(attempts):
        try:
            call()
            return
        except ShardqError:
            if i == attempts - 1:
                raise
            time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=random.randrange(1_000_000))
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of faults")
    args = parser.parse_args()
    os.chdir(ROOT)
    with tempfile.TemporaryDirectory(prefix="shardq-soak-") as tmp:
        verdict = Soak(make_plan(args.seed, args.jobs, args.duration), Path(tmp)).run()
    for problem in verdict.problems[:50]:
        print("  problem:", problem)
    print(verdict.line())
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
