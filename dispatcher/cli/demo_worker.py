"""``dispatcher demo-worker``: a worker with a few demonstration handlers, for trying a deployed
dispatcher (the Helm chart's development profile runs one) without building a worker image.

Handlers: ``demo.echo`` returns its payload; ``demo.sleep`` sleeps ``{"seconds": s}`` (at most 60)
and returns; ``demo.flaky`` fails until attempt ``{"succeed_on": n}`` (default 3), to show retries
with backoff; ``demo.fail`` raises SkipRetry, to show the dead-letter queue.
"""

from __future__ import annotations

import asyncio
from typing import Any

from worker_sdk import JobContext, SkipRetry, serve

MAX_SLEEP_S = 60.0
HANDLED = ("demo.echo", "demo.sleep", "demo.flaky", "demo.fail")


async def echo(ctx: JobContext) -> Any:
    return ctx.json()


async def sleep(ctx: JobContext) -> dict[str, float]:
    seconds = min(float((ctx.json() or {}).get("seconds", 1.0)), MAX_SLEEP_S)
    await asyncio.sleep(max(seconds, 0.0))
    return {"slept": seconds}


async def flaky(ctx: JobContext) -> dict[str, int]:
    succeed_on = int((ctx.json() or {}).get("succeed_on", 3))
    if ctx.attempt < succeed_on:
        raise RuntimeError(f"transient failure on attempt {ctx.attempt} (succeeds on {succeed_on})")
    return {"attempt": ctx.attempt}


async def fail(ctx: JobContext) -> None:
    raise SkipRetry("demo.fail never succeeds: look for it in the dead-letter queue")


def run_demo_worker(target: str | None, concurrency: int) -> int:
    """Serve the demonstration handlers until SIGTERM or SIGINT."""
    handlers = {"demo.echo": echo, "demo.sleep": sleep, "demo.flaky": flaky, "demo.fail": fail}
    serve(handlers, target=target, concurrency=concurrency).run()
    return 0
