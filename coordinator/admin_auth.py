"""Credentials of the admin listener, and keeping them apart from devices'.

The admin listener (settings.admin, D40) accepts only an admin credential:
  token  "authorization: Bearer <admin token>": the SHA-256 of the presented
         token is compared in constant time with the configured digests; the
         token itself is never kept (`admin_token_digests` hashes it at
         start, or each token of admin.token_file as it re-reads the file on
         a change) nor logged. Anything else: UNAUTHENTICATED.
  mtls   a client certificate of the federation CA whose role is admin:
         ADMIN_ROLE among the subject's organizational units
         (`fedmask certs issue-admin`). A device certificate (no such role):
         PERMISSION_DENIED.
The device listener refuses an admin credential (`DeviceListenerGuard`):
a bearer token whose digest is the admin digest, or a client certificate
with the admin role: PERMISSION_DENIED, before the device servicer runs.
The health service is exempt on both.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import inspect
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import grpc
from cryptography import x509
from cryptography.x509.oid import NameOID

from coordinator.auth import AUTHORIZATION_KEY, BEARER_PREFIX, MethodGuard, TokenFile, denying_handler
from coordinator.settings import MIN_TOKEN_LENGTH, AdminListenerSettings

#: The organizational unit (OU) of an admin client certificate's subject.
ADMIN_ROLE = "admin"
ADMIN_ONLY = "this listener accepts only admin credentials"
NOT_FOR_DEVICES = "an admin credential is not accepted on the device listener"

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")


def token_digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


Digests = Callable[[], Sequence[bytes]]


def admin_token_digests(admin: AdminListenerSettings, *, interval_s: float = 1.0) -> Digests | None:
    """The SHA-256 digests of the accepted admin tokens now: fixed for
    admin.token and admin.token_sha256; for admin.token_file one token per
    line (blank and "#" lines ignored, at least MIN_TOKEN_LENGTH
    characters), re-read when the file changes so the admin token rotates
    without a restart (as the device tokens do, D30), and kept only as
    digests, checked for a change at most every `interval_s`. None when the
    admin listener is not in token mode."""
    if admin.auth != "token":
        return None
    if admin.token_sha256 is not None:
        fixed = (bytes.fromhex(admin.token_sha256),)
        return lambda: fixed
    if admin.token is not None:
        digest = (token_digest(admin.token.get_secret_value().encode()),)
        return lambda: digest
    if admin.token_file is not None:
        return TokenFile(admin.token_file, min_length=MIN_TOKEN_LENGTH, transform=token_digest, interval_s=interval_s)
    return None


def presented_token(metadata: Any) -> bytes | None:
    """The bearer token of the call metadata, or None."""
    for key, value in metadata or ():
        if key.lower() == AUTHORIZATION_KEY:
            raw = value if isinstance(value, bytes) else str(value).encode()
            prefix = BEARER_PREFIX.encode()
            return raw[len(prefix):] if raw.startswith(prefix) else None
    return None


def digest_matches(token: bytes | None, digests: Sequence[bytes]) -> bool:
    """Whether the token's SHA-256 is one of `digests`: compared in constant
    time with every one of them (no early exit)."""
    presented = token_digest(token or b"")
    ok = False
    for digest in digests:
        ok |= hmac.compare_digest(presented, digest)
    return ok and token is not None


@functools.lru_cache(maxsize=1024)
def certificate_roles(pem: bytes) -> frozenset[str]:
    """The organizational units of a PEM certificate's subject (unparseable: none)."""
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError:
        return frozenset()
    return frozenset(str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME))


def peer_roles(context: grpc.aio.ServicerContext[Any, Any]) -> frozenset[str] | None:
    """The roles of the caller's verified client certificate; None without one."""
    pems = list(context.auth_context().get("x509_pem_cert") or ())
    if not pems:
        return None
    return certificate_roles(bytes(pems[0]))


def _checked(handler: grpc.RpcMethodHandler[_Req, _Resp], allowed: Callable[[grpc.aio.ServicerContext[Any, Any]], bool],
             detail: str) -> grpc.RpcMethodHandler[_Req, _Resp]:
    """`handler` with `allowed(context)` checked first (PERMISSION_DENIED
    otherwise); the check needs the call's context, which interceptors do
    not see."""
    kinds = (("unary_unary", grpc.unary_unary_rpc_method_handler), ("unary_stream", grpc.unary_stream_rpc_method_handler),
             ("stream_unary", grpc.stream_unary_rpc_method_handler),
             ("stream_stream", grpc.stream_stream_rpc_method_handler))
    for attr, make in kinds:
        fn = getattr(handler, attr)
        if fn is None:
            continue
        if inspect.isasyncgenfunction(fn):
            async def agen(request: Any, context: grpc.aio.ServicerContext[Any, Any], _fn: Any = fn) -> AsyncIterator[Any]:
                if not allowed(context):
                    await context.abort(grpc.StatusCode.PERMISSION_DENIED, detail)
                async for item in _fn(request, context):
                    yield item

            wrapped: Callable[..., Any] = agen
        else:
            async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any], _fn: Any = fn) -> Any:
                if not allowed(context):
                    await context.abort(grpc.StatusCode.PERMISSION_DENIED, detail)
                return await _fn(request, context)

            wrapped = call
        made: grpc.RpcMethodHandler[_Req, _Resp] = make(wrapped, handler.request_deserializer,
                                                         handler.response_serializer)
        return made
    return handler


class AdminListenerAuth(MethodGuard):
    """The admin listener's credential check (see the module doc): in token
    mode the digest, in mTLS mode the certificate's admin role; mode "none"
    (loopback only) checks nothing."""

    def __init__(self, mode: str, digests: Digests | None) -> None:
        if mode == "token" and digests is None:
            raise ValueError("admin token mode needs the token's digest")
        self._mode = mode
        self._digests = digests

    def accepts(self, metadata: Any) -> bool:
        """Token mode: whether the call metadata carries an admin token
        accepted now (a `credential_watch.CredentialCheck`); other modes: True."""
        if self._mode != "token":
            return True
        assert self._digests is not None
        return digest_matches(presented_token(metadata), self._digests())

    def guard(self, handler: grpc.RpcMethodHandler[_Req, _Resp], method: str,
              metadata: Any) -> grpc.RpcMethodHandler[_Req, _Resp]:
        if self._mode == "none":
            return handler
        if self._mode == "token":
            return handler if self.accepts(metadata) else denying_handler(handler, method)
        return _checked(handler, lambda ctx: ADMIN_ROLE in (peer_roles(ctx) or ()), ADMIN_ONLY)


class DeviceListenerGuard(MethodGuard):
    """Refuses admin credentials on the device listener (PERMISSION_DENIED):
    the admin bearer token (by digest) and admin-role client certificates."""

    def __init__(self, admin_digests: Digests | None, *, check_certificates: bool) -> None:
        """`check_certificates`: the listener verifies client certificates
        (tls.client_ca), so an admin-role one can show up."""
        self._digests = admin_digests
        self._certs = check_certificates

    def guard(self, handler: grpc.RpcMethodHandler[_Req, _Resp], method: str,
              metadata: Any) -> grpc.RpcMethodHandler[_Req, _Resp]:
        if self._digests is not None:
            token = presented_token(metadata)
            if token is not None and digest_matches(token, self._digests()):
                return denying_handler(handler, method, grpc.StatusCode.PERMISSION_DENIED, NOT_FOR_DEVICES)
        if not self._certs:
            return handler
        return _checked(handler, lambda ctx: ADMIN_ROLE not in (peer_roles(ctx) or ()), NOT_FOR_DEVICES)


__all__ = ["ADMIN_ROLE", "AdminListenerAuth", "DeviceListenerGuard", "admin_token_digests", "certificate_roles",
           "digest_matches", "peer_roles", "presented_token", "token_digest"]
