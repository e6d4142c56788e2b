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
from wire.secagg_codec.aborts import abort_to_proto, client_abort_from_proto, server_abort_from_proto
from wire.secagg_codec.consistency import (
    consistency_check_from_proto,
    consistency_check_to_proto,
    consistency_request_from_proto,
    consistency_request_to_proto,
)
from wire.secagg_codec.keys import (
    advertise_keys_from_proto,
    advertise_keys_to_proto,
    key_list_from_proto,
    key_list_to_proto,
)
from wire.secagg_codec.masked_input import masked_input_from_proto, masked_input_to_proto
from wire.secagg_codec.shares import (
    masking_request_from_proto,
    masking_request_to_proto,
    share_keys_from_proto,
    share_keys_to_proto,
    share_receipt_from_proto,
    share_receipt_to_proto,
    share_relay_from_proto,
    share_relay_to_proto,
)
from wire.secagg_codec.unmasking import (
    unmasking_request_from_proto,
    unmasking_request_to_proto,
    unmasking_response_from_proto,
    unmasking_response_to_proto,
)

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
        return advertise_keys_to_proto(m, ids)
    if isinstance(m, sm.ShareKeys):
        return share_keys_to_proto(m, ids)
    if isinstance(m, sm.ShareReceipt):
        return share_receipt_to_proto(m, ids)
    if isinstance(m, sm.MaskedInput):
        return masked_input_to_proto(m, ids, modulus_bits=modulus_bits)
    if isinstance(m, sm.ConsistencySignature):
        return consistency_check_to_proto(m, ids)
    if isinstance(m, sm.UnmaskingResponse):
        return unmasking_response_to_proto(m, ids)
    if isinstance(m, sm.ClientAbort):
        return abort_to_proto(m, ids, detail)
    raise WireError(f"not a client message: {type(m).__name__}")


def client_from_proto(p: object, ids: RoundIds, *, vector_length: int, modulus_bits: int) -> sm.Message:
    """Server side: one proto stage message (unwrapped) as its secagg message."""
    if isinstance(p, secagg_pb2.AdvertiseKeys):
        return advertise_keys_from_proto(p, ids)
    if isinstance(p, secagg_pb2.ShareKeys):
        return share_keys_from_proto(p, ids)
    if isinstance(p, secagg_pb2.ShareReceipt):
        return share_receipt_from_proto(p, ids)
    if isinstance(p, secagg_pb2.MaskedInput):
        return masked_input_from_proto(p, ids, vector_length=vector_length, modulus_bits=modulus_bits)
    if isinstance(p, secagg_pb2.ConsistencyCheck):
        return consistency_check_from_proto(p, ids)
    if isinstance(p, secagg_pb2.UnmaskingResponse):
        return unmasking_response_from_proto(p, ids)
    if isinstance(p, common_pb2.AbortNotice):
        return client_abort_from_proto(p, ids)
    raise WireError(f"not a client stage message: {type(p).__name__}")


def server_to_proto(
    m: sm.Message, ids: RoundIds, *, identity_keys: Mapping[int, bytes] | None = None, detail: str = ""
) -> ServerStageProto:
    """Any secagg server -> client message as its proto message (unwrapped)."""
    if isinstance(m, sm.KeyList):
        return key_list_to_proto(m, ids, identity_keys)
    if isinstance(m, sm.ShareRelay):
        return share_relay_to_proto(m, ids)
    if isinstance(m, sm.MaskingRequest):
        return masking_request_to_proto(m, ids)
    if isinstance(m, sm.ConsistencyRequest):
        return consistency_request_to_proto(m, ids)
    if isinstance(m, sm.UnmaskingRequest):
        return unmasking_request_to_proto(m, ids)
    if isinstance(m, sm.ServerAbort):
        return abort_to_proto(m, ids, detail)
    raise WireError(f"not a server message: {type(m).__name__}")


def server_from_proto(p: object, ids: RoundIds, *, own: sm.AdvertiseKeys | None = None) -> sm.Message:
    """Client side: one proto stage message (unwrapped) as its secagg message.
    AdvertisedKeys needs `own` (the device's AdvertiseKeys) and drops the
    identity keys; use key_list_from_proto directly in active mode."""
    if isinstance(p, secagg_pb2.AdvertisedKeys):
        if own is None:
            raise WireError("AdvertisedKeys needs the device's own AdvertiseKeys (own=)")
        return key_list_from_proto(p, ids, own)[0]
    if isinstance(p, secagg_pb2.ForwardedShares):
        return share_relay_from_proto(p, ids)
    if isinstance(p, secagg_pb2.MaskingRequest):
        return masking_request_from_proto(p, ids)
    if isinstance(p, secagg_pb2.ConsistencyCheckRequest):
        return consistency_request_from_proto(p, ids)
    if isinstance(p, secagg_pb2.UnmaskingRequest):
        return unmasking_request_from_proto(p, ids)
    if isinstance(p, common_pb2.AbortNotice):
        return server_abort_from_proto(p, ids)
    raise WireError(f"not a server stage message: {type(p).__name__}")
