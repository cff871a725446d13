"""A wake-up signal for one waiting loop, with a timeout that never swallows a cancellation.

Python 3.11's ``asyncio.timeout`` can turn a cancellation that arrives as the deadline
passes into a TimeoutError, so a loop written as ``try: async with timeout(t): await
event.wait() except TimeoutError: pass`` may ignore its own cancellation and run on
after shutdown. Here the deadline only resolves the future the loop waits on.
"""

from __future__ import annotations

import asyncio


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
        if self._set:
            return True
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        handle = None
        if timeout is not None:
            handle = loop.call_later(max(0.0, timeout), lambda: waiter.done() or waiter.set_result(None))
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
