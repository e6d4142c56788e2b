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

import abc
import hmac
import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from pathlib import Path
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


class TokenFile:
    """The accepted bearer tokens, read from a file an operator may rewrite
    while the coordinator runs (token rotation without a restart, D30): one
    token per line, blank lines and lines starting with "#" ignored, each
    at least `min_length` characters. The file is re-read when its mtime or
    size changed, checked at most every `interval_s`; a rewrite that leaves
    no valid token is ignored with a warning (the last good set stays)."""

    def __init__(self, path: Path, *, min_length: int, interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic,
                 transform: Callable[[bytes], bytes] | None = None) -> None:
        """`transform` (e.g. a hash) is applied to every token read; only
        its results are kept and returned."""
        self._path = path
        self._min = min_length
        self._transform = transform
        self._interval = interval_s
        self._clock = clock
        self._stamp: tuple[int, int] | None = None
        self._checked = -math.inf
        self._tokens: tuple[bytes, ...] = ()
        self._reload()
        if not self._tokens:
            raise ValueError(f"token file {path} holds no token of at least {min_length} characters")

    def _reload(self) -> None:
        try:
            st = self._path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return
            lines = self._path.read_text().splitlines()
        except OSError as e:
            log_event("token_file_unreadable", logging.WARNING, path=str(self._path), why=e.strerror or str(e))
            return
        tokens = tuple(ln.strip().encode() for ln in lines
                       if ln.strip() and not ln.strip().startswith("#") and len(ln.strip()) >= self._min)
        if self._transform is not None:
            tokens = tuple(self._transform(t) for t in tokens)
        self._stamp = stamp
        if not tokens:
            log_event("token_file_ignored", logging.WARNING, path=str(self._path), why="no valid token in it")
            return
        if self._tokens and tokens != self._tokens:
            log_event("tokens_rotated", path=str(self._path), accepted=len(tokens))
        self._tokens = tokens

    def __call__(self) -> tuple[bytes, ...]:
        now = self._clock()
        if now - self._checked >= self._interval:
            self._checked = now
            self._reload()
        return self._tokens


class MethodGuard(grpc.aio.ServerInterceptor):
    """An interceptor that checks calls by their method's handler. A method
    the server has no handler for, or whose full name starts with one of
    `exempt` (default: the gRPC health service), passes untouched; every
    other handler goes through `guard`, which returns it (allowed), one that
    refuses the call (`denying_handler`), or one that checks the call as it
    runs."""

    #: Full method-name prefixes that pass unchecked.
    exempt: tuple[str, ...] = (HEALTH_SERVICE_PREFIX,)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[_Req, _Resp] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[_Req, _Resp] | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method or ""
        if handler is None or method.startswith(self.exempt):
            return handler
        return self.guard(handler, method, handler_call_details.invocation_metadata)

    @abc.abstractmethod
    def guard(self, handler: grpc.RpcMethodHandler[_Req, _Resp], method: str,
              metadata: Any) -> grpc.RpcMethodHandler[_Req, _Resp]:
        """The handler that serves a call of `method` carrying `metadata`."""


class TokenAuthInterceptor(MethodGuard):
    """Rejects RPCs without an accepted bearer token (UNAUTHENTICATED).

    `token` is one fixed token, or a callable returning the accepted ones
    now (a `TokenFile`: several are accepted during a rotation). Every
    accepted token is compared in constant time. Methods whose full name
    starts with one of `exempt_prefixes` pass unauthenticated (default: the
    gRPC health service only).
    """

    def __init__(self, token: str | Callable[[], Sequence[bytes]], *,
                 exempt_prefixes: Collection[str] = (HEALTH_SERVICE_PREFIX,)) -> None:
        if isinstance(token, str):
            if not token:
                raise ValueError("token must be non-empty")
            fixed = (token.encode(),)
            self._tokens: Callable[[], Sequence[bytes]] = lambda: fixed
        else:
            self._tokens = token
        self.exempt = tuple(exempt_prefixes)

    def accepts(self, metadata: Any) -> bool:
        """Whether the call metadata carries a token accepted now (a
        `credential_watch.CredentialCheck`: open streams are checked again
        with it)."""
        presented = b""
        for key, value in metadata or ():
            if key.lower() == AUTHORIZATION_KEY:
                presented = value if isinstance(value, bytes) else str(value).encode()
                break
        ok = False
        for token in self._tokens():  # no early exit: the time does not say which token matched
            ok |= hmac.compare_digest(presented, BEARER_PREFIX.encode() + token)
        return ok

    def guard(self, handler: grpc.RpcMethodHandler[_Req, _Resp], method: str,
              metadata: Any) -> grpc.RpcMethodHandler[_Req, _Resp]:
        return handler if self.accepts(metadata) else denying_handler(handler, method)


def _denier(method: str, code: grpc.StatusCode = grpc.StatusCode.UNAUTHENTICATED,
            detail: str = UNAUTHENTICATED_DETAILS) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[None]]:
    async def _deny(_request: Any, context: grpc.aio.ServicerContext) -> None:
        # one log line per refused call (never the presented token)
        log_event(code.name.lower(), logging.WARNING, method=method, peer=context.peer())
        await context.abort(code, detail)

    return _deny


def denying_handler(handler: grpc.RpcMethodHandler[_Req, _Resp], method: str = "",
                    code: grpc.StatusCode = grpc.StatusCode.UNAUTHENTICATED,
                    detail: str = UNAUTHENTICATED_DETAILS) -> grpc.RpcMethodHandler[_Req, _Resp]:
    """A handler of the same streaming kind as `handler` that aborts at once
    with `code` and `detail` (matching the kind keeps the server from
    waiting on a request message a streaming client may not have sent)."""
    decode, encode = handler.request_deserializer, handler.response_serializer
    deny = _denier(method, code, detail)
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
