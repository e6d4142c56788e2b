"""Every DeviceErrorCode (session.proto) a device can answer a relayed
request with reaches the admin's HTTP client with a chosen status: through
the coordinator's table (coordinator/status_codes.py, device error code ->
the admin listener's gRPC status) and then the admin service's
(admin/live_views.py, gRPC status -> HTTP), each code an explicit row of
both, none by a table's default."""

from __future__ import annotations

import grpc
import pytest

from admin.live import LiveError
from admin.live_views import HTTP_STATUS, problem_for
from coordinator.errors import DeviceAnswerError
from coordinator.relay import device_error_code
from coordinator.status_codes import DEVICE_ERROR_STATUS, admin_status
from fedmask_proto.v1 import session_pb2 as S

#: What each device error code ends as, end to end.
EXPECTED = {
    "DEVICE_ERROR_CODE_UNSPECIFIED": (grpc.StatusCode.INTERNAL, 502),
    "DEVICE_ERROR_CODE_UNKNOWN_DEVICE": (grpc.StatusCode.UNAVAILABLE, 503),
    "DEVICE_ERROR_CODE_NOT_READY": (grpc.StatusCode.FAILED_PRECONDITION, 409),
    "DEVICE_ERROR_CODE_INVALID_ARGUMENT": (grpc.StatusCode.INVALID_ARGUMENT, 422),
    "DEVICE_ERROR_CODE_UNSUPPORTED": (grpc.StatusCode.INTERNAL, 502),
    "DEVICE_ERROR_CODE_INTERNAL": (grpc.StatusCode.INTERNAL, 502),
    "DEVICE_ERROR_CODE_REFUSED": (grpc.StatusCode.PERMISSION_DENIED, 403),
}


def test_every_device_error_code_has_an_expected_outcome() -> None:
    assert set(EXPECTED) == set(S.DeviceErrorCode.keys())


@pytest.mark.parametrize("name", sorted(S.DeviceErrorCode.keys()))
def test_device_error_code_walks_both_tables_to_its_http_status(name: str) -> None:
    value = S.DeviceErrorCode.Value(name)
    want_grpc, want_http = EXPECTED[name]
    assert value in DEVICE_ERROR_STATUS, f"{name} falls through to the coordinator table's default"
    exc = DeviceAnswerError(7, device_error_code(value), "why", error_code=value)
    code = admin_status(exc)
    assert code is DEVICE_ERROR_STATUS[value] is want_grpc
    assert code in HTTP_STATUS, f"{name} ({code.name}) falls through to the admin table's default"
    problem = problem_for(LiveError(code, str(exc)), what="top-k", retry_after_s=5)
    assert problem.status == HTTP_STATUS[code] == want_http


def test_a_code_the_proto_does_not_define_is_internal() -> None:
    exc = DeviceAnswerError(7, device_error_code(99), "", error_code=99)
    assert admin_status(exc) is grpc.StatusCode.INTERNAL
