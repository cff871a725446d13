"""One against two dispatcher processes, in one run: throughput and dispatcher CPU per job.

    python -m bench.sharding [--jobs 20000] [--types 32] [--rounds 2]

Each round runs bench.throughput for 1 process and for a supervisor with 2, alternating, on
fresh Redis and SQLite; the figures are medians over the rounds, the ratios are 2-process / 1-process.
"""

from __future__ import annotations

import argparse
import statistics

import uvloop

from .throughput import run


async def compare(jobs: int, types: int, rounds: int) -> dict[int, dict[str, float]]:
    results: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    for _ in range(rounds):
        for processes in (1, 2):
            results[processes].append(await run(jobs, types, "sqlite", 2, 64, processes))
    return {p: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for p, rs in results.items()}


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--types", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    medians = uvloop.run(compare(args.jobs, args.types, args.rounds))
    keys = ["ingest_jobs_per_s", "drain_jobs_per_s", "end_to_end_jobs_per_s", "dispatcher_cpu_ms_per_job"]
    print(f"{'':28} {'1 process':>12} {'2 processes':>12} {'ratio':>8}")
    for key in keys:
        one, two = medians[1][key], medians[2][key]
        print(f"{key:28} {one:12.2f} {two:12.2f} {two / one if one else float('nan'):8.2f}")


if __name__ == "__main__":
    main()
