"""Which gRPC status a coordinator error ends an RPC with, on both
listeners (pure).

Each listener has one table of the same shape: (error class, status)
pairs, the first class the error is an instance of wins (so a subclass
comes before its base), anything else is INTERNAL. A device's DeviceError
is translated once on its way out of the coordinator, here, from its
DeviceErrorCode (session.proto) to the admin listener's status; the admin
service translates that status once more, to HTTP (admin/live_views.py).

    status_of(exc, DEVICE_LISTENER)     the device listener (servicer.py)
    admin_status(exc)                   the admin listener (admin_servicer.py)
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc

from coordinator.errors import (
    CoordinatorError,
    DeviceAnswerError,
    DeviceNotConnected,
    DeviceTimeout,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ProtocolViolation,
    UnknownDevice,
    Unavailable,
    UserNotConnected,
)
from fedmask_proto.v1 import session_pb2 as S

StatusTable = tuple[tuple[type[CoordinatorError], grpc.StatusCode], ...]
Code = grpc.StatusCode

#: The device listener (fedmask.v1.Coordinator: Enroll, Session).
DEVICE_LISTENER: StatusTable = (
    (InvalidArgument, Code.INVALID_ARGUMENT),
    (PermissionDenied, Code.PERMISSION_DENIED),
    (ProtocolViolation, Code.FAILED_PRECONDITION),
    (Unavailable, Code.UNAVAILABLE),
)

#: The admin listener (fedmask.v1.CoordinatorAdmin); a DeviceAnswerError
#: goes by DEVICE_ERROR_STATUS instead. UNAVAILABLE for a device or user
#: handle that is not connected carries a retry hint (admin_servicer.py).
ADMIN_LISTENER: StatusTable = (
    (NotFound, Code.NOT_FOUND),
    (UnknownDevice, Code.NOT_FOUND),  # before its base DeviceNotConnected
    (DeviceNotConnected, Code.UNAVAILABLE),  # also DeviceDisconnected
    (UserNotConnected, Code.UNAVAILABLE),  # an unknown or offline user handle, alike
    (Unavailable, Code.UNAVAILABLE),
    (DeviceTimeout, Code.DEADLINE_EXCEEDED),
    (InvalidArgument, Code.INVALID_ARGUMENT),
    (FailedPrecondition, Code.FAILED_PRECONDITION),
    (PermissionDenied, Code.PERMISSION_DENIED),
)

#: A device's DeviceErrorCode -> the admin listener's status. Every value of
#: the enum is listed (tests/test_device_error_statuses.py checks it); a
#: value the proto does not define is INTERNAL.
DEVICE_ERROR_STATUS: Mapping[int, grpc.StatusCode] = {
    S.DEVICE_ERROR_CODE_UNSPECIFIED: Code.INTERNAL,
    S.DEVICE_ERROR_CODE_UNKNOWN_DEVICE: Code.UNAVAILABLE,  # its client no longer hosts it
    S.DEVICE_ERROR_CODE_NOT_READY: Code.FAILED_PRECONDITION,
    S.DEVICE_ERROR_CODE_INVALID_ARGUMENT: Code.INVALID_ARGUMENT,
    S.DEVICE_ERROR_CODE_UNSUPPORTED: Code.INTERNAL,
    S.DEVICE_ERROR_CODE_INTERNAL: Code.INTERNAL,
    S.DEVICE_ERROR_CODE_REFUSED: Code.PERMISSION_DENIED,
}


def status_of(exc: CoordinatorError, table: StatusTable) -> grpc.StatusCode:
    """The status of `exc` by `table` (INTERNAL when no row matches)."""
    for cls, code in table:
        if isinstance(exc, cls):
            return code
    return Code.INTERNAL


def admin_status(exc: CoordinatorError) -> grpc.StatusCode:
    """The status of `exc` on the admin listener."""
    if isinstance(exc, DeviceAnswerError):
        return DEVICE_ERROR_STATUS.get(exc.error_code, Code.INTERNAL)
    return status_of(exc, ADMIN_LISTENER)


__all__ = ["ADMIN_LISTENER", "DEVICE_ERROR_STATUS", "DEVICE_LISTENER", "StatusTable", "admin_status", "status_of"]
