"""Stage 3 (consistency check, active-adversary mode only).

    secagg (0-based ids)        proto (enrolled device ids)      direction
    ConsistencyRequest      <-> ConsistencyCheckRequest          server -> client
    ConsistencySignature    <-> ConsistencyCheck                 client -> server
"""

from __future__ import annotations

from fedmask_proto.v1 import secagg_pb2
from secagg import messages as sm
from wire.ids import RoundIds
from wire.protocol import SIGNATURE_BYTES
from wire.secagg_codec import fields


def consistency_request_to_proto(m: sm.ConsistencyRequest, ids: RoundIds) -> secagg_pb2.ConsistencyCheckRequest:
    return secagg_pb2.ConsistencyCheckRequest(
        **fields.header_to_proto(m, ids), survivors=fields.to_device_list(m.alive, ids, "ConsistencyCheckRequest.survivors")
    )


def consistency_request_from_proto(p: secagg_pb2.ConsistencyCheckRequest, ids: RoundIds) -> sm.ConsistencyRequest:
    """Client side. U3 is the WHOLE survivor set (secagg signs all of it),
    so in a sparse graph `ids` must be the full cohort map: build it from
    RoundTask.cohort (sent when the consistency check is on)."""
    what = "ConsistencyCheckRequest"
    header = fields.header_from_proto(p, ids, what)
    return sm.ConsistencyRequest(**header, alive=fields.device_list(p.survivors, ids, f"{what}.survivors"))


def consistency_check_to_proto(m: sm.ConsistencySignature, ids: RoundIds) -> secagg_pb2.ConsistencyCheck:
    return secagg_pb2.ConsistencyCheck(**fields.header_to_proto(m, ids), signature=fields.fixed(m.signature, SIGNATURE_BYTES, "signature"))


def consistency_check_from_proto(p: secagg_pb2.ConsistencyCheck, ids: RoundIds) -> sm.ConsistencySignature:
    what = "ConsistencyCheck"
    return sm.ConsistencySignature(
        **fields.header_from_proto(p, ids, what), signature=fields.fixed(p.signature, SIGNATURE_BYTES, f"{what}.signature")
    )
