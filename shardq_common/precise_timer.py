"""Callbacks at a wall-clock instant, a fraction of a millisecond after it.

The event loop's timers count whole milliseconds and fire up to a millisecond early or late (measured
with uvloop: -1.0 to +1.3 ms). A delayed job is due at its millisecond and should start then. One
thread per process sleeps until the earliest instant asked for (the kernel's sleep is precise to
tens of microseconds) and hands the callback to its loop with ``call_soon_threadsafe``, which wakes
an idle loop at once: 0.1-0.3 ms after the instant on a busy 2-core machine. Meant for the last
stretch of a wait (the promoter asks within ``LOOKAHEAD_MS`` of a due time), so entries stay few.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import threading
from collections.abc import Callable

from .clock import wall_ms_exact


class TimerHandle:
    __slots__ = ("_loop", "_callback", "cancelled")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> None:
        self._loop = loop
        self._callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def _fire(self) -> None:  # in the loop's thread
        if not self.cancelled:
            self.cancelled = True
            self._callback()


class PreciseTimer:
    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a forked child has no timer thread

    def _reset(self) -> None:
        self._due: list[tuple[float, int, TimerHandle]] = []
        self._order = itertools.count()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def call_at(self, when_ms: float, callback: Callable[[], object]) -> TimerHandle:
        """Run ``callback`` in the calling loop's thread once ``wall_ms_exact()`` reaches ``when_ms``."""
        handle = TimerHandle(asyncio.get_running_loop(), callback)
        with self._changed:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="shardq-precise-timer", daemon=True)
                self._thread.start()
            heapq.heappush(self._due, (when_ms, next(self._order), handle))
            self._changed.notify()
        return handle

    def _run(self) -> None:
        with self._changed:
            while True:
                if not self._due:
                    self._changed.wait()
                    continue
                when_ms, _, handle = self._due[0]
                wait_ms = when_ms - wall_ms_exact()
                if wait_ms > 0:
                    self._changed.wait(wait_ms / 1000)  # or until an earlier instant is asked for
                    continue
                heapq.heappop(self._due)
                if not handle.cancelled:
                    try:
                        handle._loop.call_soon_threadsafe(handle._fire)
                    except RuntimeError:
                        pass  # that loop is closed


precise_timer = PreciseTimer()
