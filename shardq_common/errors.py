"""One error root, and the mapping of errors to gRPC status codes."""

from __future__ import annotations

import grpc


class DispatcherError(Exception):
    """The dispatcher failed."""

    code = grpc.StatusCode.INTERNAL

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class InvalidArgument(DispatcherError):
    """A request field is invalid."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(DispatcherError):
    """No such job."""

    code = grpc.StatusCode.NOT_FOUND


class StoreUnavailable(DispatcherError):
    """The database is unreachable: nothing was accepted."""

    code = grpc.StatusCode.UNAVAILABLE


class Unavailable(DispatcherError):
    """A dependency (Redis) is unavailable; try again."""

    code = grpc.StatusCode.UNAVAILABLE


class ResourceExhausted(DispatcherError):
    """A per-process bound is reached (open watches); try again later."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class NotOwner(DispatcherError):
    """This process does not own the shard (its fencing epoch is stale or Redis lost the shard)."""

    code = grpc.StatusCode.UNAVAILABLE


class Unauthenticated(DispatcherError):
    """A valid bearer token is required (``authorization: Bearer <token>`` metadata)."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(DispatcherError):
    """This token's role or job-type scope does not allow the call."""

    code = grpc.StatusCode.PERMISSION_DENIED


class ConfigError(DispatcherError):
    """The configuration is invalid."""

    code = grpc.StatusCode.FAILED_PRECONDITION
