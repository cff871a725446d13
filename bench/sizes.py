"""How much work each scenario does: the issue's full figures, and a quick set for smoke runs."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Sizes:
    ingest_one_jobs: int = 100_000
    ingest_bulk_jobs: int = 100_000
    batch: int = 1_000
    #: an ingest stops after this long and reports the rate over the jobs it enqueued (a system at
    #: 100 jobs/s would otherwise take 17 minutes for 100,000)
    ingest_max_seconds: float = 30.0
    drain_jobs: int = 50_000
    #: drains whose jobs do work (a Redis round trip, 1 ms of I/O, 100 µs of CPU) stop this long
    #: after their first start and report the rate over the jobs started by then
    drain_work_jobs: int = 20_000
    drain_work_max_seconds: float = 15.0
    worker_processes: int = 2
    steady_rate: float = 116.0
    steady_seconds: float = 60.0
    burst_rate: float = 10_000.0
    burst_seconds: float = 10.0
    #: the burst is sent as bulk calls of this many jobs (100 every 10 ms at 10K/s)
    burst_batch: int = 100
    #: how long the backlog after the burst may take to clear before it is reported as "> this"
    backlog_timeout_s: float = 120.0
    instant_jobs: int = 1_000
    #: jobs due at one instant are enqueued (in bulk) this long before it
    instant_lead_s: float = 3.0
    sequential_jobs: int = 100
    sequential_delay_s: float = 0.1
    scale_small_pending: int = 10_000
    scale_large_pending: int = 1_000_000
    #: jobs leased (run) out of each pending pool to measure lease throughput
    scale_lease_jobs: int = 5_000
    memory_pending: int = 1_000_000
    #: peers fill less: bytes per job barely depend on the count, and their bulk APIs are slow
    memory_pending_peers: int = 20_000
    #: the longest any waiting step may take before the scenario is declared incomplete
    timeout_s: float = 600.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


FULL = Sizes()

QUICK = Sizes(
    ingest_one_jobs=2_000,
    ingest_bulk_jobs=3_000,
    ingest_max_seconds=1.5,
    drain_jobs=2_000,
    drain_work_jobs=1_000,
    drain_work_max_seconds=5.0,
    steady_seconds=1.5,
    burst_seconds=0.2,
    instant_jobs=100,
    instant_lead_s=0.7,
    sequential_jobs=5,
    sequential_delay_s=0.05,
    scale_small_pending=1_000,
    scale_large_pending=10_000,
    scale_lease_jobs=500,
    memory_pending=3_000,
    memory_pending_peers=2_000,
    timeout_s=30.0,
    backlog_timeout_s=30.0,
)
