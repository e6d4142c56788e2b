"""ClientAbort / ServerAbort <-> AbortNotice, both directions.

    secagg                  proto                            direction
    ClientAbort             <-> AbortNotice                  client -> server
    ServerAbort             <-> AbortNotice                  server -> client

A proto AbortNotice with device_id == 0 ("the whole round" / "all my
devices") has no single secagg counterpart: expand it with `expand_abort`
first. The reasons map through `wire.secagg_codec.abort_reasons`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from fedmask_proto.v1 import common_pb2
from secagg import messages as sm
from secagg.errors import AbortReason
from wire.errors import WireError
from wire.ids import RoundIds
from wire.secagg_codec import fields
from wire.secagg_codec.abort_reasons import ProtoAbortReason, abort_reason_from_proto, abort_reason_to_proto

MAX_DETAIL_CHARS = 1024

_Abort = TypeVar("_Abort", sm.ClientAbort, sm.ServerAbort)


def _detail(reason: AbortReason, detail: str) -> str:
    text = f"{reason.value}: {detail}" if detail else reason.value
    return text[:MAX_DETAIL_CHARS]


def abort_to_proto(m: sm.ClientAbort | sm.ServerAbort, ids: RoundIds, detail: str = "") -> common_pb2.AbortNotice:
    """ClientAbort (client -> server) or ServerAbort (server -> client) as
    an AbortNotice for that one device. The secagg reason's value leads the
    detail ("too_few_shared: ...")."""
    if not isinstance(m, sm.ClientAbort | sm.ServerAbort):
        raise WireError(f"not an abort message: {type(m).__name__}")
    return common_pb2.AbortNotice(
        **fields.header_to_proto(m, ids), reason=abort_reason_to_proto(m.reason), detail=_detail(m.reason, detail)
    )


def round_abort_notice(
    session_id: bytes, round_number: int, reason: ProtoAbortReason, detail: str = ""
) -> common_pb2.AbortNotice:
    """Server -> client: the whole round is aborted (device_id 0)."""
    return common_pb2.AbortNotice(
        session_id=session_id, round_number=round_number, device_id=0, reason=reason, detail=detail[:MAX_DETAIL_CHARS]
    )


def expand_abort(p: common_pb2.AbortNotice, device_ids: Iterable[int]) -> list[common_pb2.AbortNotice]:
    """One AbortNotice per device for a notice with device_id 0 (the devices
    concerned: the round's devices on this stream); a notice for one device
    is returned as is."""
    if p.device_id != 0:
        return [p]
    out = []
    for d in device_ids:
        q = common_pb2.AbortNotice()
        q.CopyFrom(p)
        q.device_id = d
        out.append(q)
    return out


def _abort_from_proto(kind: type[_Abort], p: common_pb2.AbortNotice, ids: RoundIds) -> _Abort:
    """The AbortNotice of one device as the secagg abort `kind`: detail at
    most MAX_DETAIL_CHARS, reason read through `abort_reason_from_proto`."""
    what = "AbortNotice"
    if len(p.detail) > MAX_DETAIL_CHARS:
        raise WireError(f"{what}.detail is longer than {MAX_DETAIL_CHARS} characters")
    return kind(**fields.header_from_proto(p, ids, what), reason=abort_reason_from_proto(p.reason, p.detail))


def client_abort_from_proto(p: common_pb2.AbortNotice, ids: RoundIds) -> sm.ClientAbort:
    """Server side: a device withdraws (device_id must be set; see expand_abort)."""
    return _abort_from_proto(sm.ClientAbort, p, ids)


def server_abort_from_proto(p: common_pb2.AbortNotice, ids: RoundIds) -> sm.ServerAbort:
    """Client side: the round (or this device's part) is over. A notice with
    device_id 0 must be expanded first (expand_abort)."""
    return _abort_from_proto(sm.ServerAbort, p, ids)
