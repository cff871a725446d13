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
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="shardq-attempts-bench-"))
    redis_server = PrivateRedis().start()
    postgres = Postgres().start()
    database = postgres.new_database()
    ratios = []
    try:
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
    print(
        f"attempt history: drain on/off median {statistics.median(ratios):.3f} over {len(ratios)} rounds "
        f"(each {args.jobs:,} no-op jobs); cost {1 - statistics.median(ratios):.1%}",
        flush=True,
    )


if __name__ == "__main__":
    main()
