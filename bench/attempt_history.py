"""What the attempt history costs: the drain of no-op jobs with it (the default) and without it
(SHARDQ_ATTEMPT_HISTORY=0), in one run.

    python -m bench.attempt_history [--jobs 30000] [--rounds 3] [--processes 2]

A private redis-server and a fresh PostgreSQL database for the run; per round, a dispatcher
(``dispatcher run``, ``--processes``) is started with the history on, then one with it off (the
order alternates between rounds, so a drift of the machine falls on both), and each drains
``--jobs`` no-op jobs queued with no worker connected: one worker (concurrency 1024) starts, and
jobs/s is from its start to the type's last job done (as bench.flow_control's drain). The history
costs, per job, one more row in the status writer's batch (an upsert into job_attempts written with
the job's final status). Prints jobs/s per drain and the ratio on/off per round and overall.

Then (``--store-rounds``, 0 to skip) the status writer's own DB cost, which the drain's noise can
hide, on the same database: per round, ``--batch`` fresh leased rows get the update a run that
succeeded commits (lease and ack merged) with its worker and without (history off), and another
``--batch`` the update of a run that failed with its job_attempts row (an error line and a 2 KB
traceback) and without it; the order alternates per round. Prints the median µs per job of each
and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from dispatcher.store import AttemptUpdate, JobRow, StoreUpdate
from dispatcher.store.open import open_store
from shardq_common.clock import wall_ms

from .flow_control import _drain
from .infra.dispatcher import Dispatcher
from .infra.postgres import Postgres
from .infra.redis_server import PrivateRedis


def _rate(
    redis_url: str, db_url: str, logs: Path, processes: int, history: bool, job_type: str, jobs: int
) -> float:
    dispatcher = Dispatcher(redis_url, db_url, logs / job_type, processes, attempt_history=int(history))
    dispatcher.start()
    try:
        return _drain(dispatcher.target, job_type, jobs, 0)
    finally:
        dispatcher.stop()


def _new_rows(prefix: str, n: int, now: int) -> list[JobRow]:
    return [
        JobRow(f"{prefix}-{i:06d}", "bench", 0, 2, b"", "leased", now, now + 60_000, 1, 0, 0, 5, 60_000,
               None, None, None, None, now, now, None, now)
        for i in range(n)
    ]  # fmt: skip


def _succeeded(job_id: str, now: int, worker: str | None) -> StoreUpdate:
    """What a run that succeeded commits: its lease's update and its ack's, merged."""
    return StoreUpdate(
        job_id, "succeeded", attempts=1, failures=0, expirations=0, started_at=now, finished_at=now,
        worker=worker,
    )  # fmt: skip


def _failed(job_id: str, now: int, error: str) -> StoreUpdate:
    return StoreUpdate(
        job_id, "delayed", run_at=now + 1000, attempts=1, failures=1, expirations=0, last_error=error
    )


def _failed_run(job_id: str, now: int, traceback: str) -> AttemptUpdate:
    return AttemptUpdate(
        job_id, 1, finished_at=now, outcome="failed", error="RuntimeError: x", traceback=traceback
    )


async def _timed(store: object, updates: list[StoreUpdate], attempts: list[AttemptUpdate]) -> float:
    began = time.perf_counter()
    await store.apply_updates(updates, attempts)  # type: ignore[attr-defined]
    return (time.perf_counter() - began) / len(updates) * 1e6


async def store_rows(db_url: str, rounds: int, batch: int) -> None:
    store = await open_store(db_url)
    await store.migrate()
    traceback = "Traceback (most recent call last):\n" + '  File "app.py", line 1, in handler\n' * 50
    us: dict[str, list[float]] = {"success+worker": [], "success": [], "failure+row": [], "failure": []}
    try:
        for n in range(rounds):
            now = wall_ms()
            sets = {name: _new_rows(f"{name}{n}", batch, now) for name in us}
            await store.insert_jobs([r for rows in sets.values() for r in rows])
            work = {
                "success+worker": ([_succeeded(r.id, now, "worker-1") for r in sets["success+worker"]], []),
                "success": ([_succeeded(r.id, now, None) for r in sets["success"]], []),
                "failure+row": (
                    [_failed(r.id, now, traceback) for r in sets["failure+row"]],
                    [_failed_run(r.id, now, traceback) for r in sets["failure+row"]],
                ),
                "failure": ([_failed(r.id, now, traceback) for r in sets["failure"]], []),
            }
            names = list(work) if n % 2 == 0 else list(reversed(work))
            for name in names:
                us[name].append(await _timed(store, *work[name]))
    finally:
        await store.close()
    med = {name: statistics.median(values) for name, values in us.items()}
    print(
        f"status writes, {rounds} rounds of {batch:,} rows, µs per job (median): "
        + ", ".join(f"{name} {value:.1f}" for name, value in med.items()),
        flush=True,
    )
    print(
        f"status writes: a run that succeeded, with its worker / without: "
        f"{med['success+worker'] / med['success']:.3f}; a run that failed, with its attempt row / "
        f"without: {med['failure+row'] / med['failure']:.3f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--store-rounds", type=int, default=20)
    parser.add_argument("--batch", type=int, default=2000)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="shardq-attempts-bench-"))
    redis_server = PrivateRedis().start()
    postgres = Postgres().start()
    database = postgres.new_database()
    ratios = []
    try:
        if args.store_rounds:
            asyncio.run(store_rows(database.url, args.store_rounds, args.batch))
        for n in range(args.rounds):
            order = (True, False) if n % 2 == 0 else (False, True)
            rates = {
                history: _rate(
                    redis_server.url,
                    database.url,
                    logs,
                    args.processes,
                    history,
                    f"{'on' if history else 'off'}{n}",
                    args.jobs,
                )  # fmt: skip
                for history in order
            }
            ratios.append(rates[True] / rates[False])
            print(
                f"round {n + 1}: history on {rates[True]:,.0f} jobs/s, off {rates[False]:,.0f} jobs/s, "
                f"on/off {ratios[-1]:.3f}",
                flush=True,
            )
    finally:
        database.drop()
        postgres.stop()
        redis_server.stop()
        shutil.rmtree(logs, ignore_errors=True)
    if ratios:
        print(
            f"attempt history: drain on/off median {statistics.median(ratios):.3f} over {len(ratios)} rounds "
            f"(each {args.jobs:,} no-op jobs); cost {1 - statistics.median(ratios):.1%}",
            flush=True,
        )


if __name__ == "__main__":
    main()
