"""The range of the 64-bit integers a peer sends (wire/id_bounds.py, D83)."""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from fedmask_proto.v1 import admin_service_pb2 as A
from fedmask_proto.v1 import coordinator_service_pb2
from fedmask_proto.v1 import session_pb2 as S
from wire.id_bounds import (
    INT64_TYPES,
    MAX_WIRE_ID,
    int64_field_paths,
    message_with,
    out_of_range_field,
    out_of_range_values,
)

def inbound_types() -> list[type[Message]]:
    """The request types of every method of both services (the device
    listener's and the admin listener's), from the descriptors."""
    services = [coordinator_service_pb2.DESCRIPTOR.services_by_name["CoordinatorService"],
                A.DESCRIPTOR.services_by_name["CoordinatorAdmin"]]
    inputs = {m.input_type.full_name: m.input_type for s in services for m in s.methods}
    return [GetMessageClass(inputs[name]) for name in sorted(inputs)]


CASES = [(t, p) for t in inbound_types() for p in int64_field_paths(t)]


def test_every_id_carrying_field_of_the_protocol_is_enumerated() -> None:
    paths = {f"{t.DESCRIPTOR.name}.{p}" for t, p in CASES}
    # the fields the issue names, and a nested and a well-known one
    assert {"ClientMessage.hello.available_device_ids", "ClientMessage.check_in.available_device_ids",
            "ClientMessage.check_in.proofs.device_id", "ClientMessage.share_receipt.undecryptable",
            "ClientMessage.share_keys.shares.sender", "ClientMessage.heartbeat.sent_at.seconds",
            "RecommendTopKRequest.device_id", "RollbackRequest.version"} <= paths
    assert len(paths) >= 30


@pytest.mark.parametrize(("message_type", "path"), CASES, ids=[f"{t.DESCRIPTOR.name}.{p}" for t, p in CASES])
def test_each_field_out_of_range_is_found_and_in_range_is_not(message_type: type[Message], path: str) -> None:
    bad_values = out_of_range_values(message_type, path)
    for bad in bad_values:
        found = out_of_range_field(message_with(message_type, path, bad))
        assert found is not None and found.endswith(f"= {bad}"), (path, found)
        assert found.replace("[0]", "").startswith(path), (path, found)
    for good in (0, 1, MAX_WIRE_ID):
        assert out_of_range_field(message_with(message_type, path, good)) is None


def test_the_first_bad_element_of_a_repeated_field_is_named() -> None:
    m = S.ClientMessage(check_in=S.CheckIn(available_device_ids=[1, 2, (1 << 64) - 1]))
    assert out_of_range_field(m) == f"check_in.available_device_ids[2] = {(1 << 64) - 1}"
    m = S.ClientMessage(check_in=S.CheckIn(proofs=[S.DeviceProof(device_id=7), S.DeviceProof(device_id=1 << 63)]))
    assert out_of_range_field(m) == f"check_in.proofs[1].device_id = {1 << 63}"
    assert out_of_range_field(S.ClientMessage(check_in=S.CheckIn(available_device_ids=[1, MAX_WIRE_ID]))) is None


def test_only_64_bit_integer_types_are_checked() -> None:
    assert INT64_TYPES == {FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64,
                           FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}
    task = S.RoundTask(secagg=S.SecaggSettings(threshold=(1 << 32) - 1))  # uint32: never out of range
    assert out_of_range_field(task) is None
