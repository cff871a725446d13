"""What a worker's handler calls when a job starts: one record per job, pushed to a Redis list.

A record is ``"seq t_enqueued run_at t_started pid"`` (seconds since the epoch, wall clock). Handlers
only append to a local buffer; a daemon thread pushes the buffer every few milliseconds, so the
measurement costs each job about a microsecond instead of a Redis round trip. The harness reads the
list (``STARTS_KEY``) to compute start lags and throughput.
"""

from __future__ import annotations

import collections
import os
import threading
import time

import redis

STARTS_KEY = "bench:starts"
REDIS_URL_ENV = "BENCH_REDIS_URL"
FLUSH_INTERVAL_S = 0.005

_probe: Probe | None = None


class Probe:
    def __init__(self, redis_url: str) -> None:
        self.pid = os.getpid()
        self.redis = redis.Redis.from_url(redis_url)
        self.buffer: collections.deque[str] = collections.deque()
        threading.Thread(target=self._flush_forever, name="bench-probe", daemon=True).start()

    def started(self, seq: int, t_enqueued: float, run_at: float) -> None:
        self.buffer.append(f"{seq} {t_enqueued:.6f} {run_at:.6f} {time.time():.6f} {self.pid}")

    def _flush_forever(self) -> None:
        while True:
            time.sleep(FLUSH_INTERVAL_S)
            batch = []
            while self.buffer:
                batch.append(self.buffer.popleft())
            if batch:
                self.redis.rpush(STARTS_KEY, *batch)


def job_started(seq: int, t_enqueued: float, run_at: float) -> None:
    """Record a start from any process; forked children (Celery prefork) get their own probe."""
    global _probe
    if _probe is None:
        _probe = Probe(os.environ[REDIS_URL_ENV])
    _probe.started(seq, t_enqueued, run_at)


def _forget_probe() -> None:
    global _probe
    _probe = None  # the parent's flush thread did not survive the fork


# Instead of comparing os.getpid() on every start, which was about 6% of a shardq worker's samples
# in a drain profile.
os.register_at_fork(after_in_child=_forget_probe)
