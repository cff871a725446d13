"""A worker process with no-op handlers, for the benchmarks."""

from __future__ import annotations

import argparse

from worker_sdk import JobContext, serve


async def noop(ctx: JobContext) -> None:
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--types", default="noop")
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    serve({t: noop for t in args.types.split(",")}, target=args.target, concurrency=args.concurrency)


if __name__ == "__main__":
    main()
