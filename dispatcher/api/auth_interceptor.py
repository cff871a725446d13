"""The server interceptor that checks every RPC's bearer token and role (see auth.py for the table).

UNAUTHENTICATED: no ``authorization: Bearer <token>`` metadata, or a token no entry knows.
PERMISSION_DENIED: a known token whose role may not call the method (or a method not in the table).
Job-type scopes need the request body, so the services check those (``auth.check_types``) with the
caller this interceptor binds for the RPC.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import structlog

from shardq_common.errors import DispatcherError, PermissionDenied, Unauthenticated

from . import auth

log = structlog.get_logger("shardq.auth")
_Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


def bearer_token(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == "authorization":
            if isinstance(value, bytes):
                value = value.decode(errors="replace")
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return str(token.strip())
            return None
    return None


class AuthInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, tokens: auth.TokenTable) -> None:
        self.tokens = tokens

    async def intercept_service(
        self, continuation: _Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        handler = await continuation(handler_call_details)
        if handler is None or auth.is_open(method):
            return handler
        token = bearer_token(handler_call_details.invocation_metadata)
        principal = self.tokens.authenticate(token) if token else None
        if principal is None:
            log.info("call refused: no valid token", method=method, token_given=token is not None)
            return _refusing(handler, Unauthenticated())
        if not principal.may_call(method):
            log.info(
                "call refused: not allowed", method=method, token=principal.name, role=str(principal.role)
            )
            return _refusing(
                handler,
                PermissionDenied(f"token {principal.name!r} (role {principal.role}) may not call {method}"),
            )
        return _bound(handler, principal)


def _kind(handler: grpc.RpcMethodHandler) -> str:
    return {
        (False, False): "unary_unary",
        (False, True): "unary_stream",
        (True, False): "stream_unary",
        (True, True): "stream_stream",
    }[(bool(handler.request_streaming), bool(handler.response_streaming))]


def _rebuild(handler: grpc.RpcMethodHandler, behavior: Callable[..., Any]) -> grpc.RpcMethodHandler:
    make = getattr(grpc, f"{_kind(handler)}_rpc_method_handler")
    return make(
        behavior,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def _bound(handler: grpc.RpcMethodHandler, principal: auth.Principal) -> grpc.RpcMethodHandler:
    """The same handler, run with ``principal`` as the caller (auth.current())."""
    behavior = getattr(handler, _kind(handler))
    if handler.response_streaming:

        async def streaming(request: Any, context: Any) -> Any:
            auth.bind(principal)
            result = behavior(request, context)
            if inspect.isasyncgen(result):
                async for message in result:
                    yield message
            else:  # a handler that writes with context.write()
                await result

        return _rebuild(handler, streaming)

    async def unary(request: Any, context: Any) -> Any:
        auth.bind(principal)
        return await behavior(request, context)

    return _rebuild(handler, unary)


def _refusing(handler: grpc.RpcMethodHandler, error: DispatcherError) -> grpc.RpcMethodHandler:
    """A handler that refuses the call from its metadata alone. It takes the request as a stream it
    never reads, so a caller without the right token cannot make this process receive a body (of up
    to SHARDQ_MAX_REQUEST_BYTES, per message): grpc reads a request message only when asked for it."""
    if handler.response_streaming:

        async def refuse_stream(requests: Any, context: Any) -> Any:
            await context.abort(error.code, str(error))
            yield  # pragma: no cover - abort raises; the yield makes this a stream handler

        return grpc.stream_stream_rpc_method_handler(
            refuse_stream,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    async def refuse(requests: Any, context: Any) -> Any:
        await context.abort(error.code, str(error))

    return grpc.stream_unary_rpc_method_handler(
        refuse,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
