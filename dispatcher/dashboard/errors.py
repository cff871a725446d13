"""How a failed operation answers over HTTP: one table from the dispatcher's gRPC codes."""

from __future__ import annotations

import grpc
from starlette.exceptions import HTTPException as StarletteHTTPException

from worker_sdk import ShardqError


class BadInput(ValueError):
    """A request's field is wrong: HTTP 400 with this message, and nothing was done."""


_HTTP = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.UNIMPLEMENTED: 501,
}


class HTTPProblem(Exception):
    """An answer other than success, with the status and the message shown to the user."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def problem_of(exc: BaseException) -> HTTPProblem | None:
    """The HTTP answer for an error an operation raised; None for a bug (it propagates, 500)."""
    if isinstance(exc, HTTPProblem):
        return exc
    if isinstance(exc, StarletteHTTPException):  # the form parser's refusals (a part too big...)
        return HTTPProblem(exc.status_code, f"request body: {exc.detail}")
    if isinstance(exc, BadInput):
        return HTTPProblem(400, str(exc))
    if isinstance(exc, ShardqError):
        message = str(exc).split(": ", 1)[-1] if ": " in str(exc) else str(exc)
        return HTTPProblem(_HTTP.get(exc.code, 502), message)
    if isinstance(exc, ValueError):  # the SDK checks its arguments before calling
        return HTTPProblem(400, str(exc))
    return None
