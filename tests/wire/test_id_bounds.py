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


def _map_message_type() -> type[Message]:
    """A message type with map<uint64, uint64> and map<string, Inner>
    fields (the protocol has none today; the rule must cover one the day
    it is added)."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="id_bounds_maps_test.proto", package="idbounds.test",
                                             syntax="proto3")
    inner = fdp.message_type.add(name="Inner")
    inner.field.add(name="device_id", number=1, type=F.TYPE_UINT64, label=F.LABEL_OPTIONAL)
    outer = fdp.message_type.add(name="Outer")
    for n, (name, key, value, type_name) in enumerate(
            [("ids", F.TYPE_UINT64, F.TYPE_UINT64, ""), ("inners", F.TYPE_STRING, F.TYPE_MESSAGE, ".idbounds.test.Inner")],
            start=1):
        entry = outer.nested_type.add(name=f"{name.capitalize()}Entry")
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, type=key, label=F.LABEL_OPTIONAL)
        value_field = entry.field.add(name="value", number=2, type=value, label=F.LABEL_OPTIONAL)
        if type_name:
            value_field.type_name = type_name
        outer.field.add(name=name, number=n, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                        type_name=f".idbounds.test.Outer.{entry.name}")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return GetMessageClass(pool.FindMessageTypeByName("idbounds.test.Outer"))


def test_map_fields_are_covered() -> None:
    outer = _map_message_type()
    m = outer()
    getattr(m, "ids")[5] = 7
    getattr(m, "inners")["a"].device_id = 3
    assert out_of_range_field(m) is None
    getattr(m, "ids")[1 << 63] = 1
    assert out_of_range_field(m) == f"ids key {1 << 63}"
    m = outer()
    getattr(m, "ids")[1] = (1 << 64) - 1
    assert out_of_range_field(m) == f"ids[1] = {(1 << 64) - 1}"
    m = outer()
    getattr(m, "inners")["b"].device_id = 1 << 63
    assert out_of_range_field(m) == f"inners[b].device_id = {1 << 63}"
