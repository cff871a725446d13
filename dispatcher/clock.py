"""Time in one place: wall-clock milliseconds for run_at and lease deadlines."""

from __future__ import annotations

import math
import time


def now_ms() -> int:
    """Unix epoch milliseconds, rounded down."""
    return time.time_ns() // 1_000_000


def ceil_ms(seconds: float) -> int:
    """Seconds since the epoch to milliseconds, rounded up so a job never runs early."""
    return math.ceil(seconds * 1000)
