"""Time in one place: two clocks, both in Unix epoch milliseconds.

* ``wall_ms()`` is the system clock. It is the clock of ``run_at``: when a delayed job or a retry
  is due, and the timestamps people read (enqueued, started, finished).
* ``steady_ms()`` reads like the wall clock but advances with the monotonic clock from the moment
  the process started. It is the clock of every deadline and duration: lease deadlines, the
  reconnect grace, ownership leases and membership heartbeats, deferred status writes. When the
  system clock steps (NTP, a VM resumed, an operator) a running dispatcher's leases neither expire
  early nor linger, and it keeps agreeing with its peers (whose clocks did not step) about who is
  alive and who owns what. The price: a process whose clock was wrong when it started stays off
  by that much until it restarts, just as it would with the wall clock.

Test hook: when ``SHARDQ_TEST_CLOCK_OFFSET_FILE`` names a file, its content (an integer, in ms)
is added to the system clock, re-read at most every ``_OFFSET_POLL_S``; a test rewrites it to
step the wall clock of a running process. ``steady_ms()`` is anchored on the wall clock (offset
included) once, at import, like a real process anchored at start.
"""

from __future__ import annotations

import math
import os
import time

_OFFSET_FILE = os.environ.get("SHARDQ_TEST_CLOCK_OFFSET_FILE", "")
_OFFSET_POLL_S = 0.05
_offset_ms = 0
_offset_read_at = -math.inf


def _test_offset_ms() -> int:
    global _offset_ms, _offset_read_at
    if not _OFFSET_FILE:
        return 0
    now = time.monotonic()
    if now - _offset_read_at >= _OFFSET_POLL_S:
        _offset_read_at = now
        try:
            with open(_OFFSET_FILE) as f:
                _offset_ms = int(f.read().strip() or 0)
        except (OSError, ValueError):
            pass  # half-written or gone: keep the last value
    return _offset_ms


def wall_ms() -> int:
    """The system clock, Unix epoch milliseconds, rounded down."""
    return time.time_ns() // 1_000_000 + _test_offset_ms()


def wall_ms_exact() -> float:
    """The system clock, Unix epoch milliseconds with their fraction (for timing a sleep)."""
    return time.time_ns() / 1_000_000 + _test_offset_ms()


_ANCHOR_WALL_MS = wall_ms()
_ANCHOR_MONOTONIC_NS = time.monotonic_ns()


def steady_ms() -> int:
    """Epoch milliseconds that never step: the wall clock at start plus monotonic time since."""
    return _ANCHOR_WALL_MS + (time.monotonic_ns() - _ANCHOR_MONOTONIC_NS) // 1_000_000


def ceil_ms(seconds: float) -> int:
    """Seconds since the epoch to milliseconds, rounded up so a job never runs early."""
    return math.ceil(seconds * 1000)
