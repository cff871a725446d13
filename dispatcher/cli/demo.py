"""``dispatcher demo``: a dispatcher and a worker on embedded defaults, and jobs flowing through them."""

from __future__ import annotations

import asyncio
import random
import signal
import sys
import tempfile
import time
from collections import Counter

from shardq_common.logs import configure

from ..config import RetryPolicy, Settings


def run_demo(jobs: int = 40, dashboard_listen: str | None = None) -> int:
    import uvloop

    return uvloop.run(_demo(jobs, dashboard_listen))


async def _keep_running_with_dashboard(target: str, listen: str) -> None:
    """After the summary: the dispatcher and its worker stay, with a dashboard on them, until Ctrl-C."""
    from ..dashboard.serve import start_dashboard
    from ..dashboard.settings import DashboardSettings

    running = await start_dashboard(DashboardSettings(listen=listen, target=target))
    say("")
    say(f"dashboard: {running.url}  (the dispatcher at {target} and its worker keep running; Ctrl-C stops)")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await running.stop()


async def _demo(n_jobs: int, dashboard_listen: str | None = None) -> int:
    from worker_sdk import AsyncClient, JobContext, SkipRetry, serve

    from ..server import start_dispatcher

    configure("warning", "console")
    data_dir = tempfile.mkdtemp(prefix="shardq-demo-")
    settings = Settings(
        metrics_listen="",
        data_dir=data_dir,
        listen="127.0.0.1:0",
        shard_count=8,
        retry=RetryPolicy(base_ms=500),
    )
    say(f"shardq demo: starting a dispatcher (private redis-server, SQLite in {data_dir})")
    running = await start_dispatcher(settings)
    target = f"127.0.0.1:{running.port}"
    started: dict[str, float] = {}
    order: list[str] = []

    async def work(ctx: JobContext) -> dict[str, int]:
        started.setdefault(ctx.job_id, time.time())
        order.append(ctx.priority)
        await asyncio.sleep(random.uniform(0.02, 0.08))
        return {"n": ctx.json()["n"]}

    async def flaky(ctx: JobContext) -> None:
        if ctx.attempt < 3:
            raise RuntimeError(f"transient failure on attempt {ctx.attempt}")

    def broken(ctx: JobContext) -> None:
        raise SkipRetry("this input can never succeed")

    worker = serve(
        {"resize": work, "email": work, "report": flaky, "import": broken},
        target=target,
        concurrency=4,
        handle_signals=False,
    )
    client = AsyncClient(target)
    try:
        say("enqueueing")
        ids: dict[str, str] = {}
        low = await client.enqueue_many(
            [{"type": "resize", "payload": {"n": i}, "priority": "low"} for i in range(n_jobs // 2)]
        )
        high = await client.enqueue_many(
            [{"type": "email", "payload": {"n": i}, "priority": "high"} for i in range(n_jobs // 4)]
        )
        for i in range(3):
            ids[f"delayed {i + 1}s"] = await client.enqueue("email", {"n": i}, delay=1.0 + i)
        ids["fails twice, then succeeds"] = await client.enqueue("report", None)
        ids["not retryable"] = await client.enqueue("import", None)
        say(f"enqueued {len(low)} low-priority, {len(high)} high-priority, 3 delayed, 1 flaky, 1 broken")
        all_ids = low + high + list(ids.values())
        async with worker:
            await worker.wait_connected()
            say(f"worker connected to {target}: low and high compete for 4 slots")
            t0 = time.time()
            while True:
                statuses = Counter()
                for job_id in all_ids:
                    statuses[(await client.get_job(job_id)).status] += 1
                line = "  ".join(f"{k}={v}" for k, v in sorted(statuses.items()))
                say(f"  t+{time.time() - t0:4.1f}s  {line}")
                if statuses["succeeded"] + statuses["dead"] == len(all_ids) or time.time() - t0 > 30:
                    break
                await asyncio.sleep(0.5)
            say("")
            say("summary")
            for label, job_id in ids.items():
                job = await client.get_job(job_id)
                extra = f", dead: {job.dead_reason}" if job.dead_reason else ""
                say(f"  {label:28} {job.status:10} attempts={job.attempts}{extra}")
            first_half = order[: len(high)]
            share = first_half.count("high") / max(1, len(first_half))
            say(f"  high-priority share of the first {len(first_half)} starts: {share:.0%} (weights 6:3:1)")
            dead = await client.dead_letters()
            say(f"  dead-letter queue: {len(dead)} job(s)")
            ok = statuses["succeeded"] == len(all_ids) - 1 and statuses["dead"] == 1
            say("demo finished: every job accounted for" if ok else "demo finished with unexpected results")
            if dashboard_listen:
                await _keep_running_with_dashboard(target, dashboard_listen)
            return 0 if ok else 1
    finally:
        await client.close()
        await running.stop()


def say(text: str) -> None:
    print(text, file=sys.stdout, flush=True)
