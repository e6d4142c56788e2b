"""The checks and conversions every stage codec shares: the message header,
device ids through the round's `RoundIds`, fixed-size byte fields and
lists bounded by the cohort size. Each raises `WireError` naming `what`
(the proto message or field) when the input is off."""

from __future__ import annotations

from collections.abc import Iterable, Sized
from typing import Protocol, TypedDict, TypeVar

from secagg import messages as sm
from secagg.config import MAX_SESSION_ID_BYTES
from wire.errors import WireError
from wire.ids import RoundIds
from wire.protocol import SIGNATURE_BYTES


class ProtoHeader(Protocol):
    """The header fields every proto stage message has."""

    @property
    def session_id(self) -> bytes: ...
    @property
    def round_number(self) -> int: ...
    @property
    def device_id(self) -> int: ...


class SecaggHeader(TypedDict):
    """The header keyword arguments of a secagg message."""

    session_id: bytes
    round_idx: int
    device_id: int


class ProtoHeaderFields(TypedDict):
    """The header keyword arguments of a proto stage message."""

    session_id: bytes
    round_number: int
    device_id: int


_S = TypeVar("_S", bound=Sized)


def header_from_proto(p: ProtoHeader, ids: RoundIds, what: str) -> SecaggHeader:
    """The secagg header of a proto message: a 1..MAX_SESSION_ID_BYTES
    session id and a device of the round (device_id 0 is refused)."""
    sid = p.session_id
    if not 1 <= len(sid) <= MAX_SESSION_ID_BYTES:
        raise WireError(f"{what}: session_id must be 1..{MAX_SESSION_ID_BYTES} bytes, got {len(sid)}")
    if p.device_id == 0:
        raise WireError(f"{what}: device_id 0 is not a device")
    return {"session_id": bytes(sid), "round_idx": int(p.round_number), "device_id": to_secagg_id(ids, p.device_id, what)}


def header_to_proto(m: sm.Message, ids: RoundIds) -> ProtoHeaderFields:
    """The proto header of a secagg message (its device as the enrolled id)."""
    return {"session_id": m.session_id, "round_number": m.round_idx, "device_id": to_device_id(ids, m.device_id, type(m).__name__)}


def to_secagg_id(ids: RoundIds, device_id: int, what: str) -> int:
    """The 0-based secagg id of an enrolled `device_id` of the round."""
    try:
        return ids.secagg(device_id)
    except WireError as exc:
        raise WireError(f"{what}: {exc}") from None


def to_device_id(ids: RoundIds, secagg_id: int, what: str) -> int:
    """The enrolled device id of a 0-based `secagg_id` of the round."""
    try:
        return ids.device(secagg_id)
    except WireError as exc:
        raise WireError(f"{what}: {exc}") from None


def bounded(items: _S, ids: RoundIds, what: str) -> _S:
    """`items`, if there are no more of them than the cohort has devices."""
    if len(items) > ids.num_clients:
        raise WireError(f"{what}: {len(items)} entries for a cohort of {ids.num_clients}")
    return items


def fixed(b: bytes, size: int, what: str) -> bytes:
    """`b` as bytes, if it is exactly `size` bytes long."""
    if len(b) != size:
        raise WireError(f"{what} must be {size} bytes, got {len(b)}")
    return bytes(b)


def optional_signature(b: bytes, what: str) -> bytes:
    """`b` as bytes, if it is empty (passive mode) or one signature."""
    if len(b) not in (0, SIGNATURE_BYTES):
        raise WireError(f"{what} must be empty or {SIGNATURE_BYTES} bytes, got {len(b)}")
    return bytes(b)


def device_list(device_ids: Iterable[int], ids: RoundIds, what: str) -> tuple[int, ...]:
    """Proto -> secagg: a bounded list of enrolled ids as secagg ids, in order."""
    items = list(device_ids)
    bounded(items, ids, what)
    return tuple(to_secagg_id(ids, d, what) for d in items)


def to_device_list(secagg_ids: Iterable[int], ids: RoundIds, what: str) -> list[int]:
    """Secagg -> proto: secagg ids as their enrolled ids, sorted."""
    return sorted(to_device_id(ids, s, what) for s in secagg_ids)
