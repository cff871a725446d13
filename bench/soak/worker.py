"""The soak's worker process: no-op handlers, 1% of jobs fail (the payload says which), and every
``--window`` seconds one JSON line with what it ran and its enqueue-to-start figures.

Enqueue-to-start is the time from the producer's stamp (``e``, epoch ms, in the payload) to the
handler's start, for jobs enqueued to run at once (delayed ones carry ``d``, recurring ones are
the schedule's). A job counts as run on its first attempt (``ran``); a failure's retry is counted
apart (``retried``), so ``ran`` summed over workers is the number of jobs that ran.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
from pathlib import Path
from typing import Any

from worker_sdk import JobContext, Worker

CRON_TYPE = "soak.cron"


class FailedOnPurpose(Exception):
    pass


class Window:
    def __init__(self) -> None:
        self.latencies_ms: list[float] = []
        self.ran = 0
        self.retried = 0
        self.cron = 0


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values.sort()
    return values[min(len(values) - 1, int(q * len(values)))]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


async def _report(out: Path, window_s: float, state: dict[str, Window]) -> None:
    with out.open("a") as f:
        while True:
            await asyncio.sleep(window_s)
            window, state["now"] = state["now"], Window()
            line: dict[str, Any] = {
                "t": time.time(),
                "ran": window.ran,
                "retried": window.retried,
                "cron": window.cron,
                "started": len(window.latencies_ms),
                "p50_ms": _quantile(window.latencies_ms, 0.50),
                "p99_ms": _quantile(window.latencies_ms, 0.99),
                "rss": _rss_bytes(),
            }
            f.write(json.dumps(line) + "\n")
            f.flush()


async def main_async(args: argparse.Namespace) -> None:
    state = {"now": Window()}

    async def handle(ctx: JobContext) -> None:
        now_ms = time.time() * 1000
        window = state["now"]
        if ctx.type == CRON_TYPE:
            window.cron += 1
            return
        payload = json.loads(ctx.payload)
        if ctx.attempt == 1:
            window.ran += 1
            if not payload.get("d"):
                window.latencies_ms.append(now_ms - payload["e"])
        else:
            window.retried += 1
        if payload.get("f"):
            raise FailedOnPurpose("the soak's 1%")

    handlers = {t: handle for t in [*args.types.split(","), CRON_TYPE]}
    worker = Worker(handlers, target=args.target, concurrency=args.concurrency)
    reporter = asyncio.create_task(_report(args.out, args.window, state))
    try:
        await worker.serve_forever()
    finally:
        reporter.cancel()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--types", required=True)
    parser.add_argument("--concurrency", type=int, default=1024)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
