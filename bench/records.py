"""Start records that workers pushed to Redis (see bench.peers._probe), and the figures made of them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import redis

STARTS_KEY = "bench:starts"


@dataclass(frozen=True)
class Start:
    seq: int
    t_enqueued: float
    run_at: float
    t_started: float
    pid: int

    @property
    def lag_ms(self) -> float:
        """Enqueue-to-start for an immediate job, due-to-start for a delayed one."""
        return (self.t_started - (self.run_at or self.t_enqueued)) * 1000


def read_starts(client: redis.Redis) -> list[Start]:
    """Every job's first start, warm-up jobs (numbered below zero) left out."""
    first: dict[int, Start] = {}
    for raw in client.lrange(STARTS_KEY, 0, -1):
        seq, t_enqueued, run_at, t_started, pid = raw.split()
        start = Start(int(seq), float(t_enqueued), float(run_at), float(t_started), int(pid))
        if start.seq >= 0 and (start.seq not in first or start.t_started < first[start.seq].t_started):
            first[start.seq] = start
    return sorted(first.values(), key=lambda s: s.t_started)


def duplicate_starts(client: redis.Redis) -> int:
    """Starts beyond each job's first: deliveries after the first (at-least-once at work)."""
    seqs = [raw.split(b" ", 1)[0] for raw in client.lrange(STARTS_KEY, 0, -1)]
    return len(seqs) - len(set(seqs))


def in_range(starts: list[Start], phase: dict[str, Any]) -> list[Start]:
    return [s for s in starts if phase["seq_start"] <= s.seq < phase["seq_end"]]


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def lag_summary(starts: list[Start]) -> dict[str, float]:
    lags = sorted(s.lag_ms for s in starts)
    if not lags:
        return {"jobs": 0}
    return {"jobs": len(lags), "p50_ms": percentile(lags, 50), "p99_ms": percentile(lags, 99),
            "max_ms": lags[-1]}  # fmt: skip


def start_rate(starts: list[Start]) -> float:
    """Jobs per second from the first start to the last (worker boot time left out)."""
    if len(starts) < 2:
        return 0.0
    span = starts[-1].t_started - starts[0].t_started
    return (len(starts) - 1) / span if span > 0 else 0.0
