"""Stage 4 (unmasking): the server's request and the devices' shares.

    secagg (0-based ids)        proto (enrolled device ids)      direction
    UnmaskingRequest        <-> UnmaskingRequest                 server -> client
    UnmaskingResponse       <-> UnmaskingResponse                client -> server

A Shamir share travels as its SHARE_BYTES big-endian field element; one
that is not below the field's PRIME is refused either way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fedmask_proto.v1 import secagg_pb2
from secagg import messages as sm
from secagg.shamir import ELEMENT_BYTES, PRIME
from wire.errors import WireError
from wire.ids import RoundIds
from wire.protocol import SIGNATURE_BYTES
from wire.secagg_codec import fields

SHARE_BYTES = ELEMENT_BYTES  # one Shamir share: 33-byte big-endian field element


def unmasking_request_to_proto(m: sm.UnmaskingRequest, ids: RoundIds) -> secagg_pb2.UnmaskingRequest:
    what = "UnmaskingRequest"
    sigs = sorted(
        (secagg_pb2.ConsistencySignature(device_id=fields.to_device_id(ids, s, what), signature=sig) for s, sig in m.signatures),
        key=lambda x: x.device_id,
    )
    return secagg_pb2.UnmaskingRequest(
        **fields.header_to_proto(m, ids),
        alive=fields.to_device_list(m.alive, ids, f"{what}.alive"),
        dropped=fields.to_device_list(m.dropped, ids, f"{what}.dropped"),
        signatures=sigs,
    )


def unmasking_request_from_proto(p: secagg_pb2.UnmaskingRequest, ids: RoundIds) -> sm.UnmaskingRequest:
    what = "UnmaskingRequest"
    header = fields.header_from_proto(p, ids, what)
    fields.bounded(p.signatures, ids, f"{what}.signatures")
    sigs = tuple(
        (fields.to_secagg_id(ids, s.device_id, f"{what}.signatures"), fields.fixed(s.signature, SIGNATURE_BYTES, f"{what}.signature"))
        for s in p.signatures
    )
    return sm.UnmaskingRequest(
        **header,
        alive=fields.device_list(p.alive, ids, f"{what}.alive"),
        dropped=fields.device_list(p.dropped, ids, f"{what}.dropped"),
        signatures=sigs,
    )


def unmasking_response_to_proto(m: sm.UnmaskingResponse, ids: RoundIds) -> secagg_pb2.UnmaskingResponse:
    what = "UnmaskingResponse"

    def shares(items: Iterable[tuple[int, int]]) -> list[secagg_pb2.SecretShare]:
        out = []
        for owner, value in items:
            if not (isinstance(value, int) and 0 <= value < PRIME):
                raise WireError(f"{what}: share of {owner} is not a field element")
            out.append(secagg_pb2.SecretShare(owner=fields.to_device_id(ids, owner, what), share=value.to_bytes(SHARE_BYTES, "big")))
        return out

    components = []
    for owner, k, value in m.component_shares:
        if not (isinstance(value, int) and 0 <= value < PRIME):
            raise WireError(f"{what}: share of {owner}'s component {k} is not a field element")
        components.append(secagg_pb2.ComponentShare(owner=fields.to_device_id(ids, owner, what), component=k,
                                                    share=value.to_bytes(SHARE_BYTES, "big")))
    return secagg_pb2.UnmaskingResponse(
        **fields.header_to_proto(m, ids), b_shares=shares(m.b_shares), s_sk_shares=shares(m.s_shares),
        component_shares=components,
    )


def unmasking_response_from_proto(p: secagg_pb2.UnmaskingResponse, ids: RoundIds) -> sm.UnmaskingResponse:
    what = "UnmaskingResponse"
    header = fields.header_from_proto(p, ids, what)

    def shares(items: Sequence[secagg_pb2.SecretShare], field: str) -> tuple[tuple[int, int], ...]:
        fields.bounded(items, ids, f"{what}.{field}")
        out = []
        for s in items:
            raw = fields.fixed(s.share, SHARE_BYTES, f"{what}.{field}.share")
            value = int.from_bytes(raw, "big")
            if value >= PRIME:
                raise WireError(f"{what}.{field}: share of {s.owner} is not a field element")
            out.append((fields.to_secagg_id(ids, s.owner, f"{what}.{field}.owner"), value))
        return tuple(out)

    field_name = f"{what}.component_shares"
    if len(p.component_shares) > ids.num_clients * ids.components:  # n owners, m components each
        raise WireError(f"{field_name}: {len(p.component_shares)} entries for a cohort of {ids.num_clients} "
                        f"with {ids.components} removable components")
    components = []
    for c in p.component_shares:
        value = int.from_bytes(fields.fixed(c.share, SHARE_BYTES, f"{field_name}.share"), "big")
        if value >= PRIME:
            raise WireError(f"{field_name}: share of {c.owner}'s component {c.component} is not a field element")
        components.append((fields.to_secagg_id(ids, c.owner, f"{field_name}.owner"), c.component, value))
    return sm.UnmaskingResponse(**header, b_shares=shares(p.b_shares, "b_shares"),
                                s_shares=shares(p.s_sk_shares, "s_sk_shares"), component_shares=tuple(components))
