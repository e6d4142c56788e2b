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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
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


@dataclass(frozen=True, slots=True)
class _Step:
    """One field of a message type that holds (or leads to) 64-bit integers."""

    repeated: bool
    is_int: bool  # a 64-bit integer field, else a message or map field
    type_name: str = ""  # the message type to walk into ("" for ints)
    #: The fields of that message type when all it holds are singular 64-bit
    #: integers (a share's sender and receiver): a repeated field of it is
    #: then checked field by field over all its elements at C speed.
    flat: tuple[str, ...] = ()
    is_map: bool = False
    key_is_int: bool = False
    value_is_int: bool = False


#: The walk of each message type (full name -> field name -> step), built
#: once per type from its descriptor: only the fields that hold 64-bit
#: integers or lead to some.
_PLANS: dict[str, dict[str, _Step]] = {}
#: Message types met as fields, by full name (their plans are built on first use).
_SUBTYPES: dict[str, Descriptor] = {}


def _leads_to_int64(descriptor: Descriptor, seen: set[str]) -> bool:
    if descriptor.full_name in seen:
        return False
    seen.add(descriptor.full_name)
    return any(f.type in INT64_TYPES or (f.message_type is not None and _leads_to_int64(f.message_type, seen))
               for f in descriptor.fields)


def _flat(descriptor: Descriptor) -> tuple[str, ...]:
    """The names of `descriptor`'s fields if every field that holds 64-bit
    integers is a singular one and none leads to more; else ()."""
    names: list[str] = []
    for f in descriptor.fields:
        if f.type in INT64_TYPES and not f.is_repeated:
            names.append(f.name)
        elif f.type in INT64_TYPES or (f.message_type is not None and _leads_to_int64(f.message_type, set())):
            return ()
    return tuple(names)


def _plan(descriptor: Descriptor) -> dict[str, _Step]:
    plan = _PLANS.get(descriptor.full_name)
    if plan is not None:
        return plan
    steps: dict[str, _Step] = {}
    for field in descriptor.fields:
        sub = field.message_type
        if field.type in INT64_TYPES:
            steps[field.name] = _Step(bool(field.is_repeated), True)
        elif sub is not None and sub.GetOptions().map_entry:
            key, value = sub.fields_by_name["key"], sub.fields_by_name["value"]
            value_type = value.message_type
            leads = value_type is not None and _leads_to_int64(value_type, set())
            if value_type is not None and leads:
                _SUBTYPES[value_type.full_name] = value_type
            if key.type in INT64_TYPES or value.type in INT64_TYPES or leads:
                steps[field.name] = _Step(True, False, value_type.full_name if leads and value_type else "",
                                          is_map=True, key_is_int=key.type in INT64_TYPES,
                                          value_is_int=value.type in INT64_TYPES)
        elif sub is not None and _leads_to_int64(sub, set()):
            _SUBTYPES[sub.full_name] = sub
            steps[field.name] = _Step(bool(field.is_repeated), False, sub.full_name, flat=_flat(sub))
    _PLANS[descriptor.full_name] = steps
    return steps


def _bad(value: object) -> bool:
    return not (isinstance(value, int) and 0 <= value <= MAX_WIRE_ID)


def _check(message: Message, plan: dict[str, _Step], depth: int) -> str | None:
    """The path (relative to `message`) and value of its first field out of
    range, or None. Walks the fields that are set (ListFields) and in the
    plan."""
    for field, value in message.ListFields():
        step = plan.get(field.name)
        if step is None:
            continue
        name = field.name
        if step.is_int:
            if not step.repeated:
                if _bad(value):
                    return f"{name} = {value}"
            elif min(value) < 0 or max(value) > MAX_WIRE_ID:
                i, v = next((i, v) for i, v in enumerate(value) if _bad(v))
                return f"{name}[{i}] = {v}"
        elif depth < MAX_DEPTH:
            found = _check_messages(name, step, value, depth)
            if found is not None:
                return found
    return None


def _check_messages(name: str, step: _Step, value: object, depth: int) -> str | None:
    if step.is_map:
        pairs = list(value.items()) if isinstance(value, Mapping) else []
        for k, v in pairs:
            if step.key_is_int and _bad(k):
                return f"{name} key {k}"
            if step.value_is_int and _bad(v):
                return f"{name}[{k}] = {v}"
            if step.type_name and isinstance(v, Message):
                found = _check(v, _plan(_SUBTYPES[step.type_name]), depth + 1)
                if found is not None:
                    return f"{name}[{k}].{found}"
        return None
    if not step.repeated:
        found = _check(value, _plan(_SUBTYPES[step.type_name]), depth + 1) if isinstance(value, Message) else None
        return None if found is None else f"{name}.{found}"
    items = value if isinstance(value, Sequence) else ()
    if step.flat:  # one pass over the elements at C speed; the bad one is looked for only when there is one
        width = len(step.flat)
        values = list(chain.from_iterable(map(attrgetter(*step.flat), items))) if width > 1 \
            else list(map(attrgetter(step.flat[0]), items))
        if values and (min(values) < 0 or max(values) > MAX_WIRE_ID):
            k, v = next((k, v) for k, v in enumerate(values) if _bad(v))
            return f"{name}[{k // width}].{step.flat[k % width]} = {v}"
        return None
    plan = _plan(_SUBTYPES[step.type_name])
    for i, item in enumerate(items):
        found = _check(item, plan, depth + 1)
        if found is not None:
            return f"{name}[{i}].{found}"
    return None


def out_of_range_field(message: Message) -> str | None:
    """The first 64-bit integer field of `message` (walked through nested
    messages, repeated fields and maps) outside 0..MAX_WIRE_ID, as
    "path = value" (path like "check_in.available_device_ids[0]"); None
    when every one is in range. The walk visits only the fields that are
    set and hold 64-bit integers or lead to some (a plan per message type,
    built once from its descriptor): a heartbeat costs a few microseconds,
    a message of 2,000 shares well under a millisecond."""
    return _check(message, _plan(_descriptor(type(message))), 0)


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
