"""Outcomes a handler can signal, and the client's errors."""

from __future__ import annotations

import grpc


class Retry(Exception):
    """Retry the job after ``delay`` seconds instead of the backoff (it still counts as a failure)."""

    def __init__(self, delay: float | None = None, message: str = "retry requested") -> None:
        super().__init__(message)
        self.delay = delay


class RateLimited(Exception):
    """The handler was rate limited (an API answered 429): the job goes back and runs again after
    ``retry_after`` seconds (more than 0, at most a day). Not a failure: the attempt is not charged,
    it is counted apart (``JobInfo.rate_limited``). ``hold_siblings``: the job's concurrency key (its
    type when it has none) starts nothing else until then either."""

    def __init__(
        self, retry_after: float, hold_siblings: bool = False, message: str = "rate limited"
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.hold_siblings = hold_siblings


class SkipRetry(Exception):
    """The error is final: dead-letter the job now (reason not_retryable)."""


class ShardqError(Exception):
    """A call to the dispatcher failed. ``code`` is the gRPC status code."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.details = message


class InvalidArgumentError(ShardqError):
    """The dispatcher rejected the request (INVALID_ARGUMENT): nothing was written."""


class NotFoundError(ShardqError):
    """No such job."""


class UnavailableError(ShardqError):
    """The dispatcher or its database is unavailable: the request was not accepted."""


def from_rpc_error(exc: grpc.RpcError) -> ShardqError:
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = (exc.details() if hasattr(exc, "details") else None) or str(exc)
    return error_for(code, details)


def error_for(code: grpc.StatusCode, details: str) -> ShardqError:
    kind = {
        grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
        grpc.StatusCode.NOT_FOUND: NotFoundError,
        grpc.StatusCode.UNAVAILABLE: UnavailableError,
    }.get(code, ShardqError)
    return kind(code, details)
