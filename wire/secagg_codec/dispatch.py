"""Any stage message, either direction: the dispatchers over the stage
codecs, and each proto stage message's field in ClientMessage /
ServerMessage (the session stream's oneof)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

from fedmask_proto.v1 import common_pb2, secagg_pb2
from secagg import messages as sm
from wire.errors import WireError
from wire.ids import RoundIds
from wire.secagg_codec import aborts, consistency, keys, masked_input, shares, unmasking

#: The proto stage messages a client sends (unwrapped from ClientMessage).
ClientStageProto: TypeAlias = (
    secagg_pb2.AdvertiseKeys
    | secagg_pb2.ShareKeys
    | secagg_pb2.ShareReceipt
    | secagg_pb2.MaskedInput
    | secagg_pb2.ConsistencyCheck
    | secagg_pb2.UnmaskingResponse
    | common_pb2.AbortNotice
)
#: The proto stage messages the server sends (unwrapped from ServerMessage).
ServerStageProto: TypeAlias = (
    secagg_pb2.AdvertisedKeys
    | secagg_pb2.ForwardedShares
    | secagg_pb2.MaskingRequest
    | secagg_pb2.ConsistencyCheckRequest
    | secagg_pb2.UnmaskingRequest
    | common_pb2.AbortNotice
)

# ClientMessage / ServerMessage oneof field of each proto stage message.
CLIENT_FIELDS = {
    secagg_pb2.AdvertiseKeys: "advertise_keys",
    secagg_pb2.ShareKeys: "share_keys",
    secagg_pb2.ShareReceipt: "share_receipt",
    secagg_pb2.MaskedInput: "masked_input",
    secagg_pb2.ConsistencyCheck: "consistency_check",
    secagg_pb2.UnmaskingResponse: "unmasking_response",
    common_pb2.AbortNotice: "abort",
}
SERVER_FIELDS = {
    secagg_pb2.AdvertisedKeys: "advertised_keys",
    secagg_pb2.ForwardedShares: "forwarded_shares",
    secagg_pb2.MaskingRequest: "masking_request",
    secagg_pb2.ConsistencyCheckRequest: "consistency_check_request",
    secagg_pb2.UnmaskingRequest: "unmasking_request",
    common_pb2.AbortNotice: "abort",
}


def client_to_proto(m: sm.Message, ids: RoundIds, *, modulus_bits: int = 32, detail: str = "") -> ClientStageProto:
    """Any secagg client -> server message as its proto message (unwrapped;
    put it in ClientMessage(**{CLIENT_FIELDS[type(p)]: p}))."""
    if isinstance(m, sm.AdvertiseKeys):
        return keys.advertise_keys_to_proto(m, ids)
    if isinstance(m, sm.ShareKeys):
        return shares.share_keys_to_proto(m, ids)
    if isinstance(m, sm.ShareReceipt):
        return shares.share_receipt_to_proto(m, ids)
    if isinstance(m, sm.MaskedInput):
        return masked_input.masked_input_to_proto(m, ids, modulus_bits=modulus_bits)
    if isinstance(m, sm.ConsistencySignature):
        return consistency.consistency_check_to_proto(m, ids)
    if isinstance(m, sm.UnmaskingResponse):
        return unmasking.unmasking_response_to_proto(m, ids)
    if isinstance(m, sm.ClientAbort):
        return aborts.abort_to_proto(m, ids, detail)
    raise WireError(f"not a client message: {type(m).__name__}")


def client_from_proto(p: object, ids: RoundIds, *, vector_length: int, modulus_bits: int) -> sm.Message:
    """Server side: one proto stage message (unwrapped) as its secagg message."""
    if isinstance(p, secagg_pb2.AdvertiseKeys):
        return keys.advertise_keys_from_proto(p, ids)
    if isinstance(p, secagg_pb2.ShareKeys):
        return shares.share_keys_from_proto(p, ids)
    if isinstance(p, secagg_pb2.ShareReceipt):
        return shares.share_receipt_from_proto(p, ids)
    if isinstance(p, secagg_pb2.MaskedInput):
        return masked_input.masked_input_from_proto(p, ids, vector_length=vector_length, modulus_bits=modulus_bits)
    if isinstance(p, secagg_pb2.ConsistencyCheck):
        return consistency.consistency_check_from_proto(p, ids)
    if isinstance(p, secagg_pb2.UnmaskingResponse):
        return unmasking.unmasking_response_from_proto(p, ids)
    if isinstance(p, common_pb2.AbortNotice):
        return aborts.client_abort_from_proto(p, ids)
    raise WireError(f"not a client stage message: {type(p).__name__}")


def server_to_proto(
    m: sm.Message, ids: RoundIds, *, identity_keys: Mapping[int, bytes] | None = None, detail: str = ""
) -> ServerStageProto:
    """Any secagg server -> client message as its proto message (unwrapped)."""
    if isinstance(m, sm.KeyList):
        return keys.key_list_to_proto(m, ids, identity_keys)
    if isinstance(m, sm.ShareRelay):
        return shares.share_relay_to_proto(m, ids)
    if isinstance(m, sm.MaskingRequest):
        return shares.masking_request_to_proto(m, ids)
    if isinstance(m, sm.ConsistencyRequest):
        return consistency.consistency_request_to_proto(m, ids)
    if isinstance(m, sm.UnmaskingRequest):
        return unmasking.unmasking_request_to_proto(m, ids)
    if isinstance(m, sm.ServerAbort):
        return aborts.abort_to_proto(m, ids, detail)
    raise WireError(f"not a server message: {type(m).__name__}")


def server_from_proto(p: object, ids: RoundIds, *, own: sm.AdvertiseKeys | None = None) -> sm.Message:
    """Client side: one proto stage message (unwrapped) as its secagg message.
    AdvertisedKeys needs `own` (the device's AdvertiseKeys) and drops the
    identity keys; use key_list_from_proto directly in active mode."""
    if isinstance(p, secagg_pb2.AdvertisedKeys):
        if own is None:
            raise WireError("AdvertisedKeys needs the device's own AdvertiseKeys (own=)")
        return keys.key_list_from_proto(p, ids, own)[0]
    if isinstance(p, secagg_pb2.ForwardedShares):
        return shares.share_relay_from_proto(p, ids)
    if isinstance(p, secagg_pb2.MaskingRequest):
        return shares.masking_request_from_proto(p, ids)
    if isinstance(p, secagg_pb2.ConsistencyCheckRequest):
        return consistency.consistency_request_from_proto(p, ids)
    if isinstance(p, secagg_pb2.UnmaskingRequest):
        return unmasking.unmasking_request_from_proto(p, ids)
    if isinstance(p, common_pb2.AbortNotice):
        return aborts.server_abort_from_proto(p, ids)
    raise WireError(f"not a server stage message: {type(p).__name__}")
