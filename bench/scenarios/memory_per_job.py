"""Memory: Redis used_memory, less client buffers, per pending small job (after - before a fill,
over the jobs), and for shardq the dispatcher processes' resident memory with those jobs pending."""

from __future__ import annotations

import time

from .context import Outcome, ScenarioContext


def settled_memory(ctx: ScenarioContext, quiet_s: float = 0.5, timeout: float = 60.0) -> int:
    """used_memory once it stopped changing: pushes behind shardq's answers and hand-offs between
    dispatchers may still be landing."""
    deadline = time.monotonic() + timeout
    last = ctx.redis.used_memory()
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = ctx.redis.used_memory()
        if abs(now - last) < 4096:
            return now
        last = now
    return last


def run(ctx: ScenarioContext) -> Outcome:
    s = ctx.sizes
    shardq = ctx.system.name.startswith("shardq")
    pending = s.memory_pending if shardq else s.memory_pending_peers
    figures: dict[str, object] = {"pending": pending}
    with ctx.stack() as stack:
        before = settled_memory(ctx, quiet_s=0.3)
        if stack.dispatcher is not None:
            figures["dispatcher_rss_idle_mb"] = stack.dispatcher.rss_bytes() / 2**20
        stack.call("fill", {"jobs": pending, "batch": s.batch}, s.timeout_s + 600)
        after = settled_memory(ctx)
        if stack.dispatcher is not None:
            figures["dispatcher_rss_mb"] = stack.dispatcher.rss_bytes() / 2**20
    figures["redis_bytes_per_job"] = (after - before) / pending
    figures["redis_used_memory_mb"] = after / 2**20
    return Outcome(figures)
