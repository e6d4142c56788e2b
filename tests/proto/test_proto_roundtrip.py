"""Wire-format round trips and contract checks of `fedmask.v1`.

Every oneof case of ClientMessage / ServerMessage is built with every field
set to a non-default value (generically, so new cases are covered without
editing this file), serialized, parsed and compared; plus hand-built
messages checking the byte contracts (tensors, packed uint32 masked input).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from fedmask_proto.v1 import (
    common_pb2,
    coordinator_service_pb2,
    enrollment_pb2,
    secagg_pb2,
    session_pb2,
)

_counter = itertools.count(1)

# Session-level cases: everything else on the stream is round-scoped and must
# carry (session_id, round_number).
_NOT_ROUND_SCOPED = {
    "hello", "check_in", "heartbeat", "device_response",
    "welcome", "check_in_ack", "shutdown", "device_request", "proof", "challenge",
}


def _scalar(field: FieldDescriptor) -> object:
    n = next(_counter)
    t = field.type
    if t == FieldDescriptor.TYPE_BYTES:
        return bytes([n % 256]) * 3
    if t == FieldDescriptor.TYPE_STRING:
        return f"s{n}"
    if t == FieldDescriptor.TYPE_BOOL:
        return True
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return n + 0.5
    if t == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        return field.enum_type.values[-1].number  # a real, non-zero value
    return n  # integer types


def _fill(msg: Message) -> Message:
    """Set every field of `msg` (the first case of each oneof) recursively."""
    desc: Descriptor = msg.DESCRIPTOR
    for field in desc.fields:
        oneof = field.containing_oneof
        if oneof is not None and field is not oneof.fields[0]:
            continue
        is_repeated = field.is_repeated
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_f = field.message_type.fields_by_name["key"]
            val_f = field.message_type.fields_by_name["value"]
            getattr(msg, field.name)[_scalar(key_f)] = _scalar(val_f)
        elif field.message_type is not None:
            if is_repeated:
                _fill(getattr(msg, field.name).add())
                _fill(getattr(msg, field.name).add())
            elif field.message_type.full_name in ("google.protobuf.Duration", "google.protobuf.Timestamp"):
                getattr(msg, field.name).FromSeconds(next(_counter))
            else:
                _fill(getattr(msg, field.name))
        elif is_repeated:
            getattr(msg, field.name).extend([_scalar(field), _scalar(field)])
        else:
            setattr(msg, field.name, _scalar(field))
    return msg


def _cases(wrapper: type[Message]) -> list[str]:
    return [f.name for f in wrapper.DESCRIPTOR.oneofs_by_name["message"].fields]


@pytest.mark.parametrize(
    ("wrapper", "case"),
    [(session_pb2.ClientMessage, c) for c in _cases(session_pb2.ClientMessage)]
    + [(session_pb2.ServerMessage, c) for c in _cases(session_pb2.ServerMessage)],
    ids=lambda v: v if isinstance(v, str) else v.__name__,
)
def test_every_oneof_case_round_trips(wrapper: type[Message], case: str) -> None:
    msg = wrapper()
    _fill(getattr(msg, case))
    data = msg.SerializeToString(deterministic=True)
    parsed = wrapper.FromString(data)
    assert parsed.WhichOneof("message") == case
    assert parsed == msg
    # Every field was set, so the inner message is not empty.
    assert getattr(parsed, case).ByteSize() > 0
    assert parsed.SerializeToString(deterministic=True) == data


@pytest.mark.parametrize(
    ("wrapper", "case"),
    [(session_pb2.ClientMessage, c) for c in _cases(session_pb2.ClientMessage)]
    + [(session_pb2.ServerMessage, c) for c in _cases(session_pb2.ServerMessage)],
    ids=lambda v: v if isinstance(v, str) else v.__name__,
)
def test_round_scoped_cases_carry_session_and_round(wrapper: type[Message], case: str) -> None:
    inner = wrapper.DESCRIPTOR.fields_by_name[case].message_type
    assert inner is not None
    if case in _NOT_ROUND_SCOPED:
        assert "session_id" not in inner.fields_by_name
        return
    sid = inner.fields_by_name["session_id"]
    rnd = inner.fields_by_name["round_number"]
    assert (sid.number, sid.type) == (1, FieldDescriptor.TYPE_BYTES)
    assert (rnd.number, rnd.type) == (2, FieldDescriptor.TYPE_UINT64)


def test_secagg_stage_messages_are_keyed_by_device() -> None:
    for name in (
        "AdvertiseKeys", "AdvertisedKeys", "ShareKeys", "ForwardedShares", "MaskedInput",
        "ConsistencyCheckRequest", "ConsistencyCheck", "UnmaskingRequest", "UnmaskingResponse",
    ):
        fields = secagg_pb2.DESCRIPTOR.message_types_by_name[name].fields_by_name
        assert fields["device_id"].number == 3, name


def test_enrolment_round_trip() -> None:
    req = enrollment_pb2.EnrollRequest(
        client_name="edge-1",
        devices=[enrollment_pb2.DeviceEnrollment(local_id="user-7", identity_public_key=b"\x01" * 32)],
    )
    assert enrollment_pb2.EnrollRequest.FromString(req.SerializeToString()) == req
    resp = enrollment_pb2.EnrollResponse(
        devices=[enrollment_pb2.EnrolledDevice(local_id="user-7", device_id=3, newly_enrolled=True)],
        protocol_version="fedmask.v1",
    )
    assert enrollment_pb2.EnrollResponse.FromString(resp.SerializeToString()) == resp


def test_round_task_carries_a_numpy_tensor_exactly() -> None:
    table = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    task = session_pb2.RoundTask(
        session_id=b"\x00" * 16,
        round_number=4,
        model_name="fedrap",
        model_version=9,
        global_parameters=common_pb2.ModelParameters(
            tensors=[
                common_pb2.NamedTensor(
                    name="item_embedding",
                    tensor=common_pb2.Tensor(
                        dtype=common_pb2.DTYPE_FLOAT32, shape=list(table.shape), data=table.astype("<f4").tobytes()
                    ),
                )
            ]
        ),
        secagg=session_pb2.SecaggSettings(threshold=3, graph=session_pb2.GRAPH_KIND_SPARSE, neighbour_count=4,
                                          modulus_bits=32, clip=0.5, cohort_size=5, vector_length=15),
        dp=session_pb2.DpSettings(mode=session_pb2.DP_MODE_LOCAL, clip_norm=0.1, noise_multiplier=1.0),
        assignments=[session_pb2.DeviceAssignment(
            self=session_pb2.Participant(device_id=11, secagg_id=1),
            neighbours=[session_pb2.Participant(device_id=12, secagg_id=2)],
        )],
    )
    task.deadlines.masked_input.FromSeconds(120)
    msg = session_pb2.ServerMessage(round_task=task)
    parsed = session_pb2.ServerMessage.FromString(msg.SerializeToString())
    t = parsed.round_task.global_parameters.tensors[0].tensor
    back = np.frombuffer(t.data, dtype="<f4").reshape(tuple(t.shape))
    np.testing.assert_array_equal(back, table)
    assert parsed.round_task.deadlines.masked_input.ToSeconds() == 120
    assert parsed.round_task.assignments[0].self.secagg_id == 1


def test_masked_input_packs_little_endian_uint32() -> None:
    y = np.array([0, 1, 2**32 - 1, 123456789], dtype=np.uint32)
    msg = session_pb2.ClientMessage(
        masked_input=secagg_pb2.MaskedInput(
            session_id=b"s" * 16, round_number=1, device_id=5,
            masked_vector=y.astype("<u4").tobytes(), length=len(y), modulus_bits=32,
        )
    )
    parsed = session_pb2.ClientMessage.FromString(msg.SerializeToString()).masked_input
    assert len(parsed.masked_vector) == 4 * parsed.length
    np.testing.assert_array_equal(np.frombuffer(parsed.masked_vector, dtype="<u4"), y)


def test_service_paths_are_versioned() -> None:
    service = coordinator_service_pb2.DESCRIPTOR.services_by_name["CoordinatorService"]
    assert service.full_name == "fedmask.v1.CoordinatorService"
    session = service.methods_by_name["Session"]
    assert session.client_streaming and session.server_streaming
    enroll = service.methods_by_name["Enroll"]
    assert not enroll.client_streaming and not enroll.server_streaming


def _reachable_fields(desc: Descriptor, seen: set[str] | None = None) -> set[str]:
    seen = set() if seen is None else seen
    if desc.full_name in seen:
        return set()
    seen.add(desc.full_name)
    names = set()
    for f in desc.fields:
        names.add(f"{desc.name}.{f.name}")
        if f.message_type is not None:
            names |= _reachable_fields(f.message_type, seen)
    return names


def test_no_upstream_field_names_private_device_state() -> None:
    """docs/design.md: private device state (user vectors, personal item tables,
    mask models, secret keys, seeds, raw ratings) never goes to the
    coordinator. Shares of secrets (secagg) are the one allowed exception."""
    import re

    forbidden = re.compile(
        r"private|secret|rating|interaction|user_vector|user_embedding|personal|mask_model|seed|"
        r"(^|_)(c|s)_sk($|_(?!shares))"
    )
    upstream = _reachable_fields(session_pb2.ClientMessage.DESCRIPTOR) | _reachable_fields(
        enrollment_pb2.EnrollRequest.DESCRIPTOR
    )
    offenders = sorted(n for n in upstream if forbidden.search(n.split(".")[1]))
    assert offenders == [], offenders
    assert "UnmaskingResponse.s_sk_shares" in upstream  # the allowed exception is really checked
