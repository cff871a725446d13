"""Wait on a condition with a timeout, instead of sleeping a fixed time."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")

Message = str | Callable[[], str]


def _describe(message: Message, predicate: Callable[[], Any], timeout: float) -> str:
    text = message() if callable(message) else message
    return text or f"condition {getattr(predicate, '__qualname__', predicate)!r} not met within {timeout:g} s"


@overload
async def wait_for(
    predicate: Callable[[], Awaitable[T]],
    timeout: float = ...,  # noqa: ASYNC109
    interval: float = ...,
    message: Message = ...,
) -> T: ...


@overload
async def wait_for(
    predicate: Callable[[], T],
    timeout: float = ...,  # noqa: ASYNC109
    interval: float = ...,
    message: Message = ...,
) -> T: ...


async def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 10.0,  # noqa: ASYNC109 - a polling deadline, not a cancellation scope
    interval: float = 0.01,
    message: Message = "",
) -> Any:
    """Poll ``predicate`` (sync, or returning an awaitable) until its result is truthy; return that result.

    Raises AssertionError with ``message`` (a string, or a callable giving one, evaluated at the
    timeout so it can describe the state then) when ``timeout`` seconds pass first. The predicate
    is always tried once more at the deadline. Exceptions from the predicate propagate.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise AssertionError(_describe(message, predicate, timeout))
        await asyncio.sleep(min(interval, remaining))


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.01,
    message: Message = "",
) -> T:
    """The blocking twin of :func:`wait_for`, for a sync predicate."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            close = getattr(result, "close", None)
            if close is not None:
                close()  # no "coroutine was never awaited" warning
            raise TypeError("wait_until() needs a sync predicate; use `await wait_for(...)` for async ones")
        if result:
            return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(_describe(message, predicate, timeout))
        time.sleep(min(interval, remaining))
