"""A wake-up signal for one waiting loop, with a timeout that never swallows a cancellation.

Python 3.11's ``asyncio.timeout`` can turn a cancellation that arrives as the deadline
passes into a TimeoutError, so a loop written as ``try: async with timeout(t): await
event.wait() except TimeoutError: pass`` may ignore its own cancellation and run on
after shutdown. Here the deadline only resolves the future the loop waits on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .precise_timer import precise_timer


class Wakeup:
    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    async def wait(self, timeout: float | None = None) -> bool:
        """Until set() or the timeout. True when woken by set()."""
        if timeout is None:
            return await self._wait(None)
        loop = asyncio.get_running_loop()
        return await self._wait(lambda done: loop.call_later(max(0.0, timeout), done))

    async def wait_until(self, wall_ms: float) -> bool:
        """Until set() or the wall clock reaches ``wall_ms``, timed to a fraction of a millisecond
        (the precise timer). True when woken by set()."""
        return await self._wait(lambda done: precise_timer.call_at(wall_ms, done))

    async def _wait(self, schedule: Callable[[Callable[[], None]], Any] | None) -> bool:
        if self._set:
            return True
        waiter = self._waiter = asyncio.get_running_loop().create_future()

        def expire() -> None:
            if not waiter.done():
                waiter.set_result(None)

        handle = schedule(expire) if schedule else None
        try:
            await waiter
        finally:
            if handle is not None:
                handle.cancel()
            self._waiter = None
        return self._set


def cancelling() -> bool:
    """Whether the current task is being cancelled: some client libraries turn a cancellation that
    lands inside them into their own error, which a loop's error handler must not swallow."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
