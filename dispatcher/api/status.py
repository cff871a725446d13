"""What an RPC's failure tells its caller: every service maps errors to gRPC status here."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import structlog

from shardq_common.errors import DispatcherError

from ..ops.redis_errors import REDIS_ERRORS, redis_transient
from ..ops.redis_faults import note_redis_error

log = structlog.get_logger("shardq.rpc")
R = TypeVar("R")
INTERNAL = (grpc.StatusCode.INTERNAL, "internal error; see the dispatcher log")


def refusal(exc: Exception, method: str) -> tuple[grpc.StatusCode, str]:
    """The status and message a request that raised ``exc`` is answered with."""
    if isinstance(exc, DispatcherError):
        return exc.code, str(exc)
    if isinstance(exc, REDIS_ERRORS):
        # Down, or refusing writes for now (READONLY, OOM, ...): worth retrying. Any other error
        # reply is no outage: retrying would meet it again.
        note_redis_error("rpc", exc, method=method)
        if redis_transient(exc):
            return grpc.StatusCode.UNAVAILABLE, f"redis unavailable: {exc}"
        return INTERNAL
    log.error("request failed", method=method, exc_info=exc)
    return INTERNAL


def rpc(method: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
    """Map errors to gRPC status in one place."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> R:
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await context.abort(*refusal(exc, method.__name__))
        raise AssertionError("unreachable")

    return wrapper
