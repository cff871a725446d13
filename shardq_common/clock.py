"""Time in one place: two clocks, both in Unix epoch milliseconds.

* ``wall_ms()`` is the system clock. It is the clock of ``run_at``: when a delayed job or a retry
  is due, and the timestamps people read (enqueued, started, finished).
* ``steady_ms()`` reads like the wall clock but never steps: it is the time of a reference shared
  by every process, Redis's ``TIME``, read once when the process starts (``anchor_steady``), plus
  the time elapsed since on the host's boot clock. It is the clock of every deadline and duration:
  lease deadlines, the reconnect grace, ownership leases and membership heartbeats, deferred status
  writes. Those deadlines are written to Redis by one process and compared by another, so:
  - a step of a dispatcher host's system clock (NTP, a VM resumed, an operator), before or after
    a process starts, moves none of them: running processes and processes started after the step
    keep agreeing about who is alive, who owns what and when a lease ends;
  - a suspend of the host counts as elapsed time (CLOCK_BOOTTIME; CLOCK_MONOTONIC stops while the
    host sleeps), so a process that slept agrees with those that did not and with those started
    after: its leases and ownership have lapsed, as they have for everyone else;
  - processes agree to within half the round trip of their anchoring read, plus the difference in
    their hosts' clock rates since (a few parts per million under NTP), plus any step of the Redis
    host's clock between their starts (a process stays anchored on what Redis said when it
    started).
  Before ``anchor_steady`` is called (a process that never talks to Redis, or before it does) the
  anchor is the process's own wall clock at import.

Test hook: when ``SHARDQ_TEST_CLOCK_OFFSET_FILE`` names a file, its content (an integer, in ms)
is added to the system clock, re-read at most every ``_OFFSET_POLL_S``; a test rewrites it to
step the wall clock of a running process, or, several processes reading one file, of a host.
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


# CLOCK_BOOTTIME where the platform has it (Linux); elsewhere the monotonic clock.
_ELAPSED_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def elapsed_ns() -> int:
    """Nanoseconds on the host's boot clock: it never steps, and counts the time the host slept."""
    return time.clock_gettime_ns(_ELAPSED_CLOCK)


_anchor_ms = wall_ms()
_anchor_elapsed_ns = elapsed_ns()
_anchored = False


def steady_ms() -> int:
    """Epoch milliseconds that never step: the shared reference at the anchor plus the time since."""
    return _anchor_ms + (elapsed_ns() - _anchor_elapsed_ns) // 1_000_000


def anchor_steady(readings: list[tuple[int, float, int]]) -> bool:
    """Anchor ``steady_ms()`` on a reference clock shared by all processes, once per process.

    ``readings`` are (``elapsed_ns()`` before the request, the reference's epoch ms in the reply,
    ``elapsed_ns()`` after it); the one with the shortest round trip is used, taken to be read
    half-way through it. Later calls change nothing (a steady clock must not step once deadlines
    have been taken from it) and return False."""
    global _anchor_ms, _anchor_elapsed_ns, _anchored
    if _anchored or not readings:
        return False
    sent, reference_ms, received = min(readings, key=lambda r: r[2] - r[0])
    _anchor_ms, _anchor_elapsed_ns, _anchored = round(reference_ms), (sent + received) // 2, True
    return True


def ceil_ms(seconds: float) -> int:
    """Seconds since the epoch to milliseconds, rounded up so a job never runs early."""
    return math.ceil(seconds * 1000)
