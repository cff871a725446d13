"""Scale: lease throughput with a small and then a large pending pool; the cost per lease should not
grow with the pool (O(log n)), so the ratio large/small should stay near 1.

One stack: fill the small pool, run some of it, top the pool up to the large size, run as many again.
"""

from __future__ import annotations

import time
from typing import Any

from ..records import read_starts, start_rate
from .context import Outcome, ScenarioContext
from .memory_per_job import settled_memory


def run(ctx: ScenarioContext) -> Outcome:
    s = ctx.sizes
    figures: dict[str, Any] = {"lease_jobs": s.scale_lease_jobs}
    lease = {"jobs": s.scale_lease_jobs, "processes": s.worker_processes, "timeout": s.timeout_s}
    pending = filled = 0  # job numbers stay unique across both fills
    with ctx.stack() as stack:
        for name, size in (("small", s.scale_small_pending), ("large", s.scale_large_pending)):
            t0 = time.perf_counter()
            fill = {"jobs": size - pending, "batch": s.batch, "first_seq": filled}
            filled += size - pending
            stack.call("fill", fill, s.timeout_s + 900)
            fill_s = time.perf_counter() - t0
            # shardq answers an enqueue at its commit: its last pushes may still be landing, and
            # leasing should start on the whole pool, not share the machine with them.
            settled_memory(ctx)
            seen = len(read_starts(ctx.redis.client))  # type: ignore[arg-type]
            result = stack.call("lease", lease, s.timeout_s + 120)
            starts = read_starts(ctx.redis.client)[seen:]  # type: ignore[arg-type]
            pending = size - s.scale_lease_jobs
            figures[name] = {"pending": size, "fill_s": fill_s, "complete": result["complete"],
                             "lease_jobs_per_s": start_rate(starts)}  # fmt: skip
    figures["ratio_large_small"] = figures["large"]["lease_jobs_per_s"] / figures["small"]["lease_jobs_per_s"]
    return Outcome(figures)
