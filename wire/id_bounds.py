"""The range of every 64-bit integer a peer sends (pure; D83).

The wire types ids as uint64, but every id the coordinator hands out
(device ids, round numbers, model versions, audit ids) is a row id or a
counter of a signed 64-bit database integer (BIGINT on PostgreSQL, INTEGER
on SQLite), so no real id is above MAX_WIRE_ID = 2^63 - 1. A message that
carries a larger value names nothing that exists; looked up as it is, it
makes the database driver raise (SQLite: "Python int too large to convert
to SQLite INTEGER"). The same bound holds for the other 64-bit integers a
peer sends (a heartbeat's sequence number, a top-k answer's item indices):
no honest value comes near it. The protocol's only signed 64-bit integers
are the seconds of Timestamps and Durations (a heartbeat's clock, a top-k
timeout): a time after 1970 and a timeout are never negative, so the range
is 0..MAX_WIRE_ID for signed types too.

So the rule is by type, not by field name: EVERY 64-bit integer field
(uint64, int64, sint64, fixed64, sfixed64) anywhere in a message from a
peer, nested and repeated fields included, lies in 0..MAX_WIRE_ID. A field
added to the protocol tomorrow is covered without a line here. What 0
means, or whether an id in range names an enrolled device, stays each
handler's business (the rule only keeps values the store cannot hold from
ever reaching it).

    out_of_range_field(message)   the first field breaking the rule, as
                                  "path = value", or None
    int64_field_paths(type)       every 64-bit integer field reachable from
                                  a message type, as paths
    message_with(type, path, v)   a message with only that field set to v, and
    out_of_range_values(type, path)  the values that break the rule there
                                  (for tests and `fedmask bench hostile`)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar, cast

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

M = TypeVar("M", bound=Message)

#: The largest id (or other 64-bit integer) a peer may send: the largest
#: value of a signed 64-bit database integer.
MAX_WIRE_ID = (1 << 63) - 1

#: The protobuf scalar types that are 64-bit integers.
INT64_TYPES = frozenset({
    FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64,
})

#: Deeper nesting is not walked (no message of the protocol nests this deep;
#: a recursive message type would otherwise have no bottom).
MAX_DEPTH = 16


def _is_repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def _is_map(field: FieldDescriptor) -> bool:
    message_type = field.message_type
    return message_type is not None and bool(message_type.GetOptions().map_entry)


def out_of_range_field(message: Message, *, _prefix: str = "", _depth: int = 0) -> str | None:
    """The first 64-bit integer field of `message` (walked through nested
    messages, repeated fields and maps) outside 0..MAX_WIRE_ID, as
    "path = value" (path like "check_in.available_device_ids[0]"); None
    when every one is in range. Only fields that are set are visited, so
    the cost is that of the message's own contents."""
    if _depth > MAX_DEPTH:
        return None
    for field, value in message.ListFields():
        path = f"{_prefix}{field.name}"
        if field.type in INT64_TYPES:
            if not _is_repeated(field):
                if not _in_range(value):
                    return f"{path} = {value}"
                continue
            for i, v in enumerate(value):
                if not _in_range(v):
                    return f"{path}[{i}] = {v}"
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            found = _walk_message_field(field, value, path, _depth)
            if found is not None:
                return found
    return None


def _in_range(value: object) -> bool:
    return isinstance(value, int) and 0 <= value <= MAX_WIRE_ID


def _walk_message_field(field: FieldDescriptor, value: object, path: str, depth: int) -> str | None:
    if _is_map(field):
        entry = field.message_type
        assert entry is not None  # a map field's entry type
        key_field, value_field = entry.fields_by_name["key"], entry.fields_by_name["value"]
        pairs = list(value.items()) if isinstance(value, Mapping) else []
        for k, v in pairs:
            if key_field.type in INT64_TYPES and not _in_range(k):
                return f"{path} key {k}"
            if value_field.type in INT64_TYPES and not _in_range(v):
                return f"{path}[{k}] = {v}"
            if isinstance(v, Message):
                found = out_of_range_field(v, _prefix=f"{path}[{k}].", _depth=depth + 1)
                if found is not None:
                    return found
        return None
    items = list(value) if isinstance(value, Iterable) else [value]
    for i, item in enumerate(items):
        if not isinstance(item, Message):
            continue
        prefix = f"{path}[{i}]." if _is_repeated(field) else f"{path}."
        found = out_of_range_field(item, _prefix=prefix, _depth=depth + 1)
        if found is not None:
            return found
    return None


def _descriptor(message_type: type[Message]) -> Descriptor:
    return cast(Descriptor, message_type.DESCRIPTOR)


def int64_field_paths(message_type: type[Message]) -> list[str]:
    """Every 64-bit integer field reachable from `message_type`, as dotted
    paths of field names ("check_in.proofs.device_id"; a repeated or map
    field is one step), in declaration order. A message type met again
    inside itself is not entered twice."""
    out: list[str] = []

    def walk(d: Descriptor, prefix: str, seen: tuple[str, ...]) -> None:
        for field in d.fields:
            path = f"{prefix}{field.name}"
            if field.type in INT64_TYPES:
                out.append(path)
            elif field.message_type is not None and field.message_type.full_name not in seen:
                walk(field.message_type, f"{path}.", (*seen, field.message_type.full_name))

    descriptor = _descriptor(message_type)
    walk(descriptor, "", (descriptor.full_name,))
    return out


_SIGNED = frozenset({FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64})


def _field_at(descriptor: Descriptor, path: str) -> FieldDescriptor:
    *steps, last = path.split(".")
    d: Descriptor | None = descriptor
    for step in steps:
        assert d is not None, path
        d = d.fields_by_name[step].message_type
    assert d is not None, path
    return d.fields_by_name[last]


def message_with(message_type: type[M], path: str, value: int) -> M:
    """A new `message_type` whose field at `path` (int64_field_paths'
    notation) is `value`; each repeated field on the way gets one element.
    Nothing is checked: this builds what a hostile peer would send."""
    message = message_type()
    *steps, last = path.split(".")
    node: Message = message
    for step in steps:
        child = getattr(node, step)
        node = child.add() if node.DESCRIPTOR.fields_by_name[step].is_repeated else child
    if node.DESCRIPTOR.fields_by_name[last].is_repeated:
        getattr(node, last).append(value)
    else:
        setattr(node, last, value)
    return message


def out_of_range_values(message_type: type[Message], path: str) -> tuple[int, int]:
    """Two values that break the rule at `path`: 2^63 and 2^64 - 1 for an
    unsigned field, -1 and -2^63 for a signed one (whose positive range is
    all allowed)."""
    if _field_at(_descriptor(message_type), path).type in _SIGNED:
        return -1, -(1 << 63)
    return 1 << 63, (1 << 64) - 1


__all__ = ["INT64_TYPES", "MAX_WIRE_ID", "int64_field_paths", "message_with", "out_of_range_field",
           "out_of_range_values"]
