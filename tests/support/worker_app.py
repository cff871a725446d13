"""A worker process for the end-to-end tests: handlers that record every execution in a ledger.

    python -m tests.support.worker_app --target HOST:PORT --ledger FILE [--concurrency N] [--types a,b]

Each ledger line is JSON written with one os.write on an O_APPEND descriptor, so a line is complete
even when the process is SIGKILLed right after.
Handlers (by job type prefix): ``noop*`` returns at once; ``sleep*`` sleeps payload["sleep"] seconds
(on attempts up to payload["sleep_attempts"]); ``fail*`` always raises; ``flaky*`` raises until
attempt > payload["fail_times"]; ``final*`` raises SkipRetry; ``limited*`` raises
RateLimited(payload["retry_after"], payload["hold_siblings"]) its first payload["limited_times"] runs in
this worker (default 1); ``sync*`` is a sync handler (run in a thread)
that returns at once; ``block*`` is a sync handler that blocks its thread forever and never looks at
ctx.cancelled. A handler that returns returns the bytes of payload["result_hex"] as the job's result
(none without it). ``fail*`` with payload["deep"] raises at the end of a chain of that many
exceptions (a long traceback). ``progress*`` reports progress payload["steps"] times (up to 1.0,
then the object payload["last"] if given), payload["step_sleep"] seconds apart, and returns
payload["result"] as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time

from worker_sdk import AsyncClient, JobContext, RateLimited, SkipRetry, serve


class Ledger:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, event: str, ctx: JobContext, **extra: object) -> None:
        line = {
            "event": event,
            "job": ctx.job_id,
            "type": ctx.type,
            "token": ctx.token,
            "attempt": ctx.attempt,
            "priority": ctx.priority,
            "t": time.time(),
            "run_at": ctx.run_at.timestamp(),
            "pid": os.getpid(),
            "key": ctx.concurrency_key,
            **extra,
        }
        os.write(self.fd, (json.dumps(line) + "\n").encode())


def _fail_deep(depth: int, message: str) -> None:
    """Raise after a chain of ``depth`` exceptions, each printed with its own traceback."""
    cause: Exception | None = None
    for step in range(depth):
        try:
            raise ValueError(f"step {step} of the chain") from cause
        except ValueError as exc:
            cause = exc
    raise RuntimeError(message) from cause


def handlers_for(types: list[str], ledger: Ledger) -> dict[str, object]:
    limited: dict[str, int] = {}  # job id -> RateLimited raised for it so far (attempts do not count them)

    async def handle(ctx: JobContext) -> bytes | None:
        ledger.write("start", ctx)
        payload = ctx.json() or {}
        kind = ctx.type
        if kind.startswith("sleep") and ctx.attempt <= int(payload.get("sleep_attempts", 1000)):
            await asyncio.sleep(float(payload.get("sleep", 1.0)))
        elif kind.startswith("fail"):
            ledger.write("fail", ctx)
            _fail_deep(int(payload.get("deep", 0)), f"{ctx.type} always fails (attempt {ctx.attempt})")
        elif kind.startswith("collect"):  # issue 21: what the jobs it waited for left it
            if any(k.startswith(":") for k in ctx.headers):
                raise RuntimeError(f"the dispatcher's own headers reached the handler: {dict(ctx.headers)}")
            seen = {d.job_id: [d.type, d.state, d.result.hex()] for d in ctx.dependency_results().values()}
            ledger.write("end", ctx)
            return json.dumps(seen).encode()
        elif kind.startswith("grow"):  # issue 21: a job of a batch adds jobs to it, then finishes
            async with AsyncClient(payload["target"]) as client:
                added = await client.add_to_batch(payload["batch"], [dict(j) for j in payload["add"]])
            ledger.write("end", ctx, added=added)
            return json.dumps(added).encode()
        elif kind.startswith("progress"):
            steps = int(payload.get("steps", 10))
            for i in range(steps):
                ctx.progress((i + 1) / steps)
                await asyncio.sleep(float(payload.get("step_sleep", 0)))
            if "last" in payload:
                ctx.progress(payload["last"])
            ledger.write("end", ctx)
            return json.dumps(payload.get("result")).encode()
        elif kind.startswith("flaky") and ctx.attempt <= int(payload.get("fail_times", 1)):
            ledger.write("fail", ctx)
            raise RuntimeError(f"flaky failure on attempt {ctx.attempt}")
        elif kind.startswith("final"):
            ledger.write("fail", ctx)
            raise SkipRetry("not retryable")
        elif kind.startswith("limited") and limited.get(ctx.job_id, 0) < int(payload.get("limited_times", 1)):
            limited[ctx.job_id] = limited.get(ctx.job_id, 0) + 1
            ledger.write("rate_limited", ctx)
            raise RateLimited(
                float(payload.get("retry_after", 1.0)), bool(payload.get("hold_siblings", False))
            )
        ledger.write("end", ctx)
        return bytes.fromhex(payload["result_hex"]) if "result_hex" in payload else None

    def sync(ctx: JobContext) -> None:
        ledger.write("start", ctx)
        ledger.write("end", ctx)

    def block(ctx: JobContext) -> None:
        ledger.write("start", ctx)
        threading.Event().wait()

    def handler_for(job_type: str) -> object:
        return sync if job_type.startswith("sync") else block if job_type.startswith("block") else handle

    return {t: handler_for(t) for t in types}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--types", default="noop")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--worker-id")
    parser.add_argument("--grace", type=float, default=5.0)
    parser.add_argument("--job-timeout", type=float, help="abandon and retry a handler running longer")
    args = parser.parse_args()
    ledger = Ledger(args.ledger)
    serve(
        handlers_for(args.types.split(","), ledger),
        target=args.target,
        concurrency=args.concurrency,
        worker_id=args.worker_id,
        shutdown_grace=args.grace,
        max_reconnect_delay=0.5,
        job_timeout=args.job_timeout,
    )


if __name__ == "__main__":
    main()
