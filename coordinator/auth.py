"""Transport authentication of the coordinator's gRPC server (grpc.aio).

Two modes (CoordinatorSettings.auth.mode):
  mtls   TLS with required client certificates from the federation CA; the
         TLS layer rejects unauthenticated peers before any RPC runs, and
         `peer_common_name` names the caller (the certificate CN).
  token  `TokenAuthInterceptor`: every RPC must carry the metadata
         "authorization: Bearer <token>"; otherwise it fails with
         UNAUTHENTICATED before reaching the servicer. The health service is
         exempt by default, so probes work without credentials.

Tokens are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any, TypeVar

import grpc

from coordinator.logs import log_event

AUTHORIZATION_KEY = "authorization"
BEARER_PREFIX = "Bearer "
HEALTH_SERVICE_PREFIX = "/grpc.health.v1.Health/"
UNAUTHENTICATED_DETAILS = "missing or invalid bearer token"

_Req = TypeVar("_Req")  # a method's request and response types
_Resp = TypeVar("_Resp")


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying `token` (for clients on plaintext channels; on
    TLS channels grpc.access_token_call_credentials does the same)."""
    return ((AUTHORIZATION_KEY, BEARER_PREFIX + token),)


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Rejects RPCs without the configured bearer token (UNAUTHENTICATED).

    Methods whose full name starts with one of `exempt_prefixes` pass
    unauthenticated (default: the gRPC health service only).
    """

    def __init__(self, token: str, *, exempt_prefixes: Collection[str] = (HEALTH_SERVICE_PREFIX,)) -> None:
        if not token:
            raise ValueError("token must be non-empty")
        self._expected = (BEARER_PREFIX + token).encode()
        self._exempt = tuple(exempt_prefixes)

    def _authorized(self, metadata: Any) -> bool:
        presented = b""
        for key, value in metadata or ():
            if key.lower() == AUTHORIZATION_KEY:
                presented = value if isinstance(value, bytes) else str(value).encode()
                break
        return hmac.compare_digest(presented, self._expected)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[_Req, _Resp] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[_Req, _Resp] | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method or ""
        if handler is None or method.startswith(self._exempt):
            return handler
        if self._authorized(handler_call_details.invocation_metadata):
            return handler
        return _denying_handler(handler, method)


def _denier(method: str) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[None]]:
    async def _deny(_request: Any, context: grpc.aio.ServicerContext) -> None:
        # one log line per refused call (never the presented token)
        log_event("unauthenticated", logging.WARNING, method=method, peer=context.peer())
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_DETAILS)

    return _deny


def _denying_handler(handler: grpc.RpcMethodHandler[_Req, _Resp], method: str = "") -> grpc.RpcMethodHandler[_Req, _Resp]:
    """A handler of the same streaming kind as `handler` that aborts at once
    (matching the kind keeps the server from waiting on a request message a
    streaming client may not have sent)."""
    decode, encode = handler.request_deserializer, handler.response_serializer
    deny = _denier(method)
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny, decode, encode)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny, decode, encode)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny, decode, encode)
    return grpc.unary_unary_rpc_method_handler(deny, decode, encode)


def peer_common_name(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    """The CN of the caller's verified TLS client certificate, or None
    (plaintext channel or no client certificate)."""
    names = list(context.auth_context().get("x509_common_name") or ())
    return names[0].decode() if names else None
