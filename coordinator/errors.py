"""Errors the coordinator's handlers raise; coordinator/status_codes.py maps
each to one gRPC status code per listener (and nothing else escapes as
INTERNAL)."""

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


class NotFound(CoordinatorError):
    """An operator named something that does not exist, e.g. a model version
    (NOT_FOUND)."""


class FailedPrecondition(CoordinatorError):
    """The operator action does not apply to the state now, e.g. no round to
    abort (FAILED_PRECONDITION)."""


# ---------------------------------------------------------------- device requests
# Raised by `DeviceRelay.request_top_k` (the relay of DeviceRequests over the
# session stream, coordinator/device_relay.py); coordinator/status_codes.py
# maps them to the admin listener's status codes.


class DeviceRequestError(CoordinatorError):
    """Base of the errors of a request relayed to a device."""


class DeviceNotConnected(DeviceRequestError):
    """No open session stream hosts the device, so nothing was sent."""

    def __init__(self, device_id: int, detail: str = "no open session hosts it") -> None:
        super().__init__(f"device {device_id} is not connected: {detail}")
        self.device_id = device_id


class UnknownDevice(DeviceNotConnected):
    """The device id was never enrolled with this coordinator."""

    def __init__(self, device_id: int) -> None:
        super().__init__(device_id, "no such enrolled device")


class DeviceDisconnected(DeviceNotConnected):
    """The request was sent, then the stream hosting the device closed (or
    the coordinator shut down) before the answer came."""

    def __init__(self, device_id: int, why: str) -> None:
        super().__init__(device_id, f"its session closed before it answered ({why})")


class UserNotConnected(DeviceRequestError):
    """No connected device has the user handle a request names: the handle
    is unknown, or its device is offline. Both answer with this one message
    (UNAVAILABLE, with a retry hint), so a caller cannot tell which handles
    exist (D84)."""

    def __init__(self) -> None:
        super().__init__("no connected device has this user handle")


class DeviceTimeout(DeviceRequestError):
    """The device did not answer within the request's timeout."""

    def __init__(self, device_id: int, timeout_s: float) -> None:
        super().__init__(f"device {device_id} did not answer within {timeout_s:g} s")
        self.device_id = device_id
        self.timeout_s = timeout_s


class DeviceAnswerError(DeviceRequestError):
    """The device answered with a DeviceError. `error_code` is its
    DeviceErrorCode value (session.proto), `code` that value's lower-case
    suffix for messages and logs ("not_ready", "invalid_argument", ...)."""

    def __init__(self, device_id: int, code: str, message: str, *, error_code: int) -> None:
        super().__init__(f"device {device_id} answered {code}: {message}" if message else f"device {device_id} answered {code}")
        self.device_id = device_id
        self.code = code
        self.error_code = error_code
        self.device_message = message


class InvalidDeviceAnswer(DeviceRequestError):
    """The device's answer breaks the message contract (wrong kind, lengths,
    order or item ids); it is dropped, the stream goes on."""

    def __init__(self, device_id: int, why: str) -> None:
        super().__init__(f"device {device_id} sent an invalid answer: {why}")
        self.device_id = device_id
