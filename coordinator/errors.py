"""Errors the coordinator's handlers raise; the servicer maps each to one
gRPC status code (and nothing else escapes as INTERNAL)."""

from __future__ import annotations


class CoordinatorError(Exception):
    """Base: `str(exc)` is safe to send to the client (no secrets)."""


class InvalidArgument(CoordinatorError):
    """Malformed request (INVALID_ARGUMENT)."""


class PermissionDenied(CoordinatorError):
    """Revoked device, or a device owned by another client (PERMISSION_DENIED)."""


class ProtocolViolation(CoordinatorError):
    """The session stream broke its contract (FAILED_PRECONDITION); the stream ends."""


class Unavailable(CoordinatorError):
    """The coordinator is starting or shutting down (UNAVAILABLE)."""
