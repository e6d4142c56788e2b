"""secagg AbortReason / DropReason <-> the proto enum fedmask.v1.AbortReason.

The secagg vocabulary is finer than the proto's: `abort_reason_to_proto`
is lossy, and the secagg reason also travels as the prefix of
AbortNotice.detail, which `abort_reason_from_proto` prefers. `reason_name`
is the spelling stores and logs use.
"""

from __future__ import annotations

from typing import TypeAlias

from fedmask_proto.v1 import common_pb2
from secagg.errors import AbortReason, DropReason
from wire.errors import WireError

#: A value of the proto enum fedmask.v1.AbortReason (a plain int at run time;
#: mypy-protobuf types the enum's values as this NewType of int).
ProtoAbortReason: TypeAlias = common_pb2.AbortReason.ValueType

# secagg -> proto. Lossy: the secagg reason's value also travels as the
# prefix of AbortNotice.detail ("too_few_shared: ..."), and `from_proto`
# prefers that prefix when it names a secagg reason.
_TO_PROTO_REASON: dict[AbortReason, ProtoAbortReason] = {
    AbortReason.TOO_FEW_ADVERTISED: common_pb2.ABORT_REASON_TOO_FEW_SURVIVORS,
    AbortReason.TOO_FEW_SHARED: common_pb2.ABORT_REASON_TOO_FEW_SURVIVORS,
    AbortReason.TOO_FEW_MASKED_INPUTS: common_pb2.ABORT_REASON_TOO_FEW_SURVIVORS,
    AbortReason.TOO_FEW_SIGNATURES: common_pb2.ABORT_REASON_TOO_FEW_SURVIVORS,
    AbortReason.TOO_FEW_UNMASKING_RESPONSES: common_pb2.ABORT_REASON_TOO_FEW_SURVIVORS,
    AbortReason.RECONSTRUCTION_FAILED: common_pb2.ABORT_REASON_UNMASKING_FAILED,
    AbortReason.CANCELLED: common_pb2.ABORT_REASON_CANCELLED,
    AbortReason.SERVER_ABORTED: common_pb2.ABORT_REASON_CANCELLED,
    AbortReason.WRONG_SESSION_OR_ROUND: common_pb2.ABORT_REASON_PROTOCOL_VIOLATION,
    AbortReason.UNEXPECTED_MESSAGE: common_pb2.ABORT_REASON_PROTOCOL_VIOLATION,
    AbortReason.MALFORMED_MESSAGE: common_pb2.ABORT_REASON_PROTOCOL_VIOLATION,
    AbortReason.INVALID_KEY_LIST: common_pb2.ABORT_REASON_PROTOCOL_VIOLATION,
    AbortReason.INVALID_SHARE_RELAY: common_pb2.ABORT_REASON_PROTOCOL_VIOLATION,
    AbortReason.INVALID_CONSISTENCY_REQUEST: common_pb2.ABORT_REASON_PROTOCOL_VIOLATION,
    AbortReason.INVALID_UNMASKING_REQUEST: common_pb2.ABORT_REASON_PROTOCOL_VIOLATION,
    AbortReason.INVALID_SIGNATURE: common_pb2.ABORT_REASON_INVALID_SIGNATURE,
    AbortReason.TOO_FEW_CHECKED: common_pb2.ABORT_REASON_TOO_FEW_SURVIVORS,
    AbortReason.SHARES_UNDECRYPTABLE: common_pb2.ABORT_REASON_DECRYPTION_FAILED,
    AbortReason.INVALID_MASKING_REQUEST: common_pb2.ABORT_REASON_PROTOCOL_VIOLATION,
}

# proto -> secagg, when the detail carries no secagg reason.
_FROM_PROTO_REASON: dict[ProtoAbortReason, AbortReason] = {
    common_pb2.ABORT_REASON_TOO_FEW_SURVIVORS: AbortReason.TOO_FEW_ADVERTISED,
    common_pb2.ABORT_REASON_PROTOCOL_VIOLATION: AbortReason.MALFORMED_MESSAGE,
    common_pb2.ABORT_REASON_INVALID_SIGNATURE: AbortReason.INVALID_SIGNATURE,
    common_pb2.ABORT_REASON_CONSISTENCY_CHECK_FAILED: AbortReason.INVALID_CONSISTENCY_REQUEST,
    common_pb2.ABORT_REASON_DECRYPTION_FAILED: AbortReason.INVALID_SHARE_RELAY,
    common_pb2.ABORT_REASON_UNMASKING_FAILED: AbortReason.RECONSTRUCTION_FAILED,
}
_SECAGG_REASON_BY_VALUE = {r.value: r for r in AbortReason}


def abort_reason_to_proto(reason: AbortReason) -> ProtoAbortReason:
    """The proto AbortReason (enum int) for a secagg AbortReason."""
    try:
        return _TO_PROTO_REASON[reason]
    except KeyError:
        raise WireError(f"no proto abort reason for {reason!r}") from None


def abort_reason_from_proto(reason: ProtoAbortReason, detail: str = "") -> AbortReason:
    """The secagg AbortReason for a proto one: the `detail` prefix if it
    names a secagg reason, else a fixed representative (CANCELLED for the
    reasons secagg has no word for: shutdown, deadline, client error...)."""
    prefix = detail.split(":", 1)[0].strip()
    if prefix in _SECAGG_REASON_BY_VALUE:
        return _SECAGG_REASON_BY_VALUE[prefix]
    if reason == common_pb2.ABORT_REASON_UNSPECIFIED or reason not in common_pb2.AbortReason.values():
        raise WireError(f"AbortNotice has an unknown or unspecified reason ({reason})")
    return _FROM_PROTO_REASON.get(reason, AbortReason.CANCELLED)


# secagg DropReason -> the AbortNotice a dropped device gets (None: no
# notice, it aborted itself); PROTOCOL_VIOLATION for every other reason.
_DROP_NOTICE: dict[DropReason, ProtoAbortReason | None] = {
    DropReason.INVALID_SIGNATURE: common_pb2.ABORT_REASON_INVALID_SIGNATURE,
    DropReason.CLIENT_ABORTED: None,
    DropReason.NEIGHBOURHOOD_TOO_SMALL: common_pb2.ABORT_REASON_TOO_FEW_SURVIVORS,
    DropReason.TOO_FEW_SIGNERS_NEARBY: common_pb2.ABORT_REASON_TOO_FEW_SURVIVORS,
    DropReason.REPORTED_UNDECRYPTABLE: common_pb2.ABORT_REASON_DECRYPTION_FAILED,
}


def drop_notice_reason(reason: DropReason) -> ProtoAbortReason | None:
    """The proto AbortReason of the notice a device dropped for `reason`
    gets, or None when it gets none (it aborted itself)."""
    return _DROP_NOTICE.get(reason, common_pb2.ABORT_REASON_PROTOCOL_VIOLATION)


def reason_name(reason: int) -> str:
    """The stored / logged spelling of a proto AbortReason: its lower-case
    suffix ("too_few_survivors"); "unknown_<n>" for a value the proto lacks."""
    try:
        return common_pb2.AbortReason.Name(ProtoAbortReason(reason)).removeprefix("ABORT_REASON_").lower()
    except ValueError:
        return f"unknown_{int(reason)}"
