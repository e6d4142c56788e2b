"""secagg stage messages <-> fedmask.v1 proto messages, both directions.

    secagg (0-based ids)        proto (enrolled device ids)      direction
    AdvertiseKeys           <-> AdvertiseKeys                    client -> server
    KeyList                 <-> AdvertisedKeys (self excluded)   server -> client
    ShareKeys               <-> ShareKeys                        client -> server
    ShareRelay              <-> ForwardedShares                  server -> client
    ShareReceipt            <-> ShareReceipt                     client -> server
    MaskingRequest          <-> MaskingRequest                   server -> client
    MaskedInput             <-> MaskedInput (LE uint32 bytes)    client -> server
    ConsistencyRequest      <-> ConsistencyCheckRequest          server -> client
    ConsistencySignature    <-> ConsistencyCheck                 client -> server
    UnmaskingRequest        <-> UnmaskingRequest                 server -> client
    UnmaskingResponse       <-> UnmaskingResponse                client -> server
    ClientAbort             <-> AbortNotice                      client -> server
    ServerAbort             <-> AbortNotice                      server -> client

Every ``*_to_proto`` takes the secagg message and the round's `RoundIds`
(see wire.ids for the 1-based/0-based mapping); every ``*_from_proto`` takes
the proto message and the same map and returns the secagg message, after
checking sizes, ids and list lengths: anything off raises `WireError`.

Not checked here (the caller's job): that (session_id, round_number) is the
device's current round (replay rule: the receiver *discards* such messages),
and that the sending stream hosts `device_id`. Semantic checks (signatures,
the neighbourhood, duplicates inside the protocol) are the secagg states'.

A proto AbortNotice with device_id == 0 ("the whole round" / "all my
devices") has no single secagg counterpart: expand it with `expand_abort`
first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Sized
from typing import Protocol, TypeAlias, TypedDict, TypeVar

import numpy as np

from fedmask_proto.v1 import common_pb2, secagg_pb2
from secagg import messages as sm
from secagg.config import MAX_SESSION_ID_BYTES
from secagg.errors import AbortReason, DropReason
from secagg.shamir import ELEMENT_BYTES, PRIME
from wire.errors import WireError
from wire.ids import RoundIds
from wire.protocol import IDENTITY_KEY_BYTES, PUBLIC_KEY_BYTES, SEALED_SHARES_BYTES, SIGNATURE_BYTES

SHARE_BYTES = ELEMENT_BYTES  # one Shamir share: 33-byte big-endian field element
MAX_DETAIL_CHARS = 1024

#: A value of the proto enum fedmask.v1.AbortReason (a plain int at run time;
#: mypy-protobuf types the enum's values as this NewType of int).
ProtoAbortReason: TypeAlias = common_pb2.AbortReason.ValueType

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

# --------------------------------------------------------------------------- abort reasons

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


# --------------------------------------------------------------------------- helpers


class _ProtoHeader(Protocol):
    """The header fields every proto stage message has."""

    @property
    def session_id(self) -> bytes: ...
    @property
    def round_number(self) -> int: ...
    @property
    def device_id(self) -> int: ...


class _SecaggHeader(TypedDict):
    """The header keyword arguments of a secagg message."""

    session_id: bytes
    round_idx: int
    device_id: int


class _ProtoHeaderFields(TypedDict):
    """The header keyword arguments of a proto stage message."""

    session_id: bytes
    round_number: int
    device_id: int


_S = TypeVar("_S", bound=Sized)


def _header_from_proto(p: _ProtoHeader, ids: RoundIds, what: str) -> _SecaggHeader:
    sid = p.session_id
    if not 1 <= len(sid) <= MAX_SESSION_ID_BYTES:
        raise WireError(f"{what}: session_id must be 1..{MAX_SESSION_ID_BYTES} bytes, got {len(sid)}")
    if p.device_id == 0:
        raise WireError(f"{what}: device_id 0 is not a device")
    return {"session_id": bytes(sid), "round_idx": int(p.round_number), "device_id": _sid(ids, p.device_id, what)}


def _header_to_proto(m: sm.Message, ids: RoundIds) -> _ProtoHeaderFields:
    return {"session_id": m.session_id, "round_number": m.round_idx, "device_id": _did(ids, m.device_id, type(m).__name__)}


def _sid(ids: RoundIds, device_id: int, what: str) -> int:
    try:
        return ids.secagg(device_id)
    except WireError as exc:
        raise WireError(f"{what}: {exc}") from None


def _did(ids: RoundIds, secagg_id: int, what: str) -> int:
    try:
        return ids.device(secagg_id)
    except WireError as exc:
        raise WireError(f"{what}: {exc}") from None


def _bounded(items: _S, ids: RoundIds, what: str) -> _S:
    if len(items) > ids.num_clients:
        raise WireError(f"{what}: {len(items)} entries for a cohort of {ids.num_clients}")
    return items


def _fixed(b: bytes, size: int, what: str) -> bytes:
    if len(b) != size:
        raise WireError(f"{what} must be {size} bytes, got {len(b)}")
    return bytes(b)


def _signature(b: bytes, what: str) -> bytes:
    if len(b) not in (0, SIGNATURE_BYTES):
        raise WireError(f"{what} must be empty or {SIGNATURE_BYTES} bytes, got {len(b)}")
    return bytes(b)


def _device_list(device_ids: Iterable[int], ids: RoundIds, what: str) -> tuple[int, ...]:
    items = list(device_ids)
    _bounded(items, ids, what)
    return tuple(_sid(ids, d, what) for d in items)


def _to_device_list(secagg_ids: Iterable[int], ids: RoundIds, what: str) -> list[int]:
    return sorted(_did(ids, s, what) for s in secagg_ids)


# --------------------------------------------------------------------------- stage 0


def advertise_keys_to_proto(m: sm.AdvertiseKeys, ids: RoundIds) -> secagg_pb2.AdvertiseKeys:
    return secagg_pb2.AdvertiseKeys(
        **_header_to_proto(m, ids),
        c_pk=_fixed(m.c_public, PUBLIC_KEY_BYTES, "c_pk"),
        s_pk=_fixed(m.s_public, PUBLIC_KEY_BYTES, "s_pk"),
        signature=_signature(m.signature, "signature"),
    )


def advertise_keys_from_proto(p: secagg_pb2.AdvertiseKeys, ids: RoundIds) -> sm.AdvertiseKeys:
    what = "AdvertiseKeys"
    return sm.AdvertiseKeys(
        **_header_from_proto(p, ids, what),
        c_public=_fixed(p.c_pk, PUBLIC_KEY_BYTES, f"{what}.c_pk"),
        s_public=_fixed(p.s_pk, PUBLIC_KEY_BYTES, f"{what}.s_pk"),
        signature=_signature(p.signature, f"{what}.signature"),
    )


def key_list_to_proto(
    m: sm.KeyList, ids: RoundIds, identity_keys: Mapping[int, bytes] | None = None
) -> secagg_pb2.AdvertisedKeys:
    """Server side. The addressee's own entry is left out (proto contract);
    `identity_keys` (secagg id -> raw Ed25519 public key) is attached to each
    peer in active-adversary mode."""
    what = "AdvertisedKeys"
    peers = []
    for e in m.entries:
        if e.device_id == m.device_id:
            continue
        ident = b""
        if identity_keys is not None:
            ident = identity_keys.get(e.device_id, b"")
        peers.append(
            secagg_pb2.PeerKeys(
                device_id=_did(ids, e.device_id, what),
                c_pk=e.c_public,
                s_pk=e.s_public,
                signature=e.signature,
                identity_public_key=ident,
            )
        )
    peers.sort(key=lambda p: p.device_id)
    return secagg_pb2.AdvertisedKeys(**_header_to_proto(m, ids), peers=peers)


def key_list_from_proto(
    p: secagg_pb2.AdvertisedKeys,
    ids: RoundIds,
    own: sm.AdvertiseKeys,
    *,
    own_identity_public_key: bytes | None = None,
) -> tuple[sm.KeyList, dict[int, bytes]]:
    """Client side. `own` is the AdvertiseKeys this device sent: its entry
    is put back (secagg's KeyList includes the addressee). Returns the
    KeyList and the identity keys (secagg id -> raw Ed25519 public key) of
    the peers the server attached them to, plus the device's own
    (`own_identity_public_key`): in active mode the client states verify the
    device's own consistency signature too, so the map they get as
    `peer_identity_keys` must hold it."""
    what = "AdvertisedKeys"
    header = _header_from_proto(p, ids, what)
    if header["device_id"] != own.device_id:
        raise WireError(f"{what} is for device {p.device_id}, not the device whose keys were given")
    _bounded(p.peers, ids, f"{what}.peers")
    entries = [sm.KeyEntry(own.device_id, own.c_public, own.s_public, own.signature)]
    identity: dict[int, bytes] = {}
    if own_identity_public_key is not None:
        identity[own.device_id] = _fixed(own_identity_public_key, IDENTITY_KEY_BYTES, "own_identity_public_key")
    for peer in p.peers:
        if peer.device_id == p.device_id:
            raise WireError(f"{what} lists the addressee itself")
        sid = _sid(ids, peer.device_id, f"{what}.peers")
        entries.append(
            sm.KeyEntry(
                sid,
                _fixed(peer.c_pk, PUBLIC_KEY_BYTES, f"{what}.peers.c_pk"),
                _fixed(peer.s_pk, PUBLIC_KEY_BYTES, f"{what}.peers.s_pk"),
                _signature(peer.signature, f"{what}.peers.signature"),
            )
        )
        if peer.identity_public_key:
            identity[sid] = _fixed(peer.identity_public_key, IDENTITY_KEY_BYTES, f"{what}.peers.identity_public_key")
    entries.sort(key=lambda e: e.device_id)
    return sm.KeyList(**header, entries=tuple(entries)), identity


# --------------------------------------------------------------------------- stage 1


def share_keys_to_proto(m: sm.ShareKeys, ids: RoundIds) -> secagg_pb2.ShareKeys:
    what = "ShareKeys"
    sender = _did(ids, m.device_id, what)
    return secagg_pb2.ShareKeys(
        **_header_to_proto(m, ids),
        shares=[
            secagg_pb2.EncryptedShare(sender=sender, receiver=_did(ids, r, what), ciphertext=blob)
            for r, blob in m.shares
        ],
    )


def share_keys_from_proto(p: secagg_pb2.ShareKeys, ids: RoundIds) -> sm.ShareKeys:
    what = "ShareKeys"
    header = _header_from_proto(p, ids, what)
    _bounded(p.shares, ids, f"{what}.shares")
    out = []
    for s in p.shares:
        if s.sender != p.device_id:
            raise WireError(f"{what}: a share names sender {s.sender}, not {p.device_id}")
        out.append(
            (_sid(ids, s.receiver, f"{what}.shares.receiver"), _fixed(s.ciphertext, SEALED_SHARES_BYTES, f"{what}.ciphertext"))
        )
    return sm.ShareKeys(**header, shares=tuple(out))


def share_relay_to_proto(m: sm.ShareRelay, ids: RoundIds) -> secagg_pb2.ForwardedShares:
    what = "ForwardedShares"
    receiver = _did(ids, m.device_id, what)
    return secagg_pb2.ForwardedShares(
        **_header_to_proto(m, ids),
        shares=[
            secagg_pb2.EncryptedShare(sender=_did(ids, s, what), receiver=receiver, ciphertext=blob)
            for s, blob in m.shares
        ],
    )


def share_relay_from_proto(p: secagg_pb2.ForwardedShares, ids: RoundIds) -> sm.ShareRelay:
    what = "ForwardedShares"
    header = _header_from_proto(p, ids, what)
    _bounded(p.shares, ids, f"{what}.shares")
    out = []
    for s in p.shares:
        if s.receiver != p.device_id:
            raise WireError(f"{what}: a share names receiver {s.receiver}, not {p.device_id}")
        out.append(
            (_sid(ids, s.sender, f"{what}.shares.sender"), _fixed(s.ciphertext, SEALED_SHARES_BYTES, f"{what}.ciphertext"))
        )
    return sm.ShareRelay(**header, shares=tuple(out))


# --------------------------------------------------------------------------- share check


def share_receipt_to_proto(m: sm.ShareReceipt, ids: RoundIds) -> secagg_pb2.ShareReceipt:
    return secagg_pb2.ShareReceipt(
        **_header_to_proto(m, ids),
        undecryptable=_to_device_list(m.undecryptable, ids, "ShareReceipt.undecryptable"),
    )


def share_receipt_from_proto(p: secagg_pb2.ShareReceipt, ids: RoundIds) -> sm.ShareReceipt:
    what = "ShareReceipt"
    header = _header_from_proto(p, ids, what)
    return sm.ShareReceipt(**header, undecryptable=_device_list(p.undecryptable, ids, f"{what}.undecryptable"))


def masking_request_to_proto(m: sm.MaskingRequest, ids: RoundIds) -> secagg_pb2.MaskingRequest:
    return secagg_pb2.MaskingRequest(
        **_header_to_proto(m, ids), peers=_to_device_list(m.peers, ids, "MaskingRequest.peers")
    )


def masking_request_from_proto(p: secagg_pb2.MaskingRequest, ids: RoundIds) -> sm.MaskingRequest:
    what = "MaskingRequest"
    header = _header_from_proto(p, ids, what)
    return sm.MaskingRequest(**header, peers=_device_list(p.peers, ids, f"{what}.peers"))


# --------------------------------------------------------------------------- stage 2


def masked_input_to_proto(m: sm.MaskedInput, ids: RoundIds, *, modulus_bits: int) -> secagg_pb2.MaskedInput:
    v = m.vector
    if not isinstance(v, np.ndarray) or v.dtype != np.uint32 or v.ndim != 1:
        raise WireError("MaskedInput.vector must be a 1-D np.uint32 array")
    return secagg_pb2.MaskedInput(
        **_header_to_proto(m, ids),
        masked_vector=v.astype("<u4", copy=False).tobytes(),
        length=v.shape[0],
        modulus_bits=modulus_bits,
    )


def masked_input_from_proto(
    p: secagg_pb2.MaskedInput, ids: RoundIds, *, vector_length: int, modulus_bits: int
) -> sm.MaskedInput:
    """The vector is a read-only zero-copy view of the proto's bytes
    (np.frombuffer); the secagg server adds it into its sum in place.

    Note: secagg masks modulo 2^32 whatever modulus_bits is, so the words
    are arbitrary uint32; `modulus_bits` is only checked to match the round."""
    what = "MaskedInput"
    header = _header_from_proto(p, ids, what)
    if p.length != vector_length:
        raise WireError(f"{what}.length is {p.length}, the round's vector_length is {vector_length}")
    if len(p.masked_vector) != 4 * vector_length:
        raise WireError(f"{what}.masked_vector is {len(p.masked_vector)} bytes, expected 4 * {vector_length}")
    if p.modulus_bits != modulus_bits:
        raise WireError(f"{what}.modulus_bits is {p.modulus_bits}, the round's is {modulus_bits}")
    vector = np.frombuffer(p.masked_vector, dtype="<u4")
    if vector.dtype != np.uint32:  # big-endian host: one conversion
        vector = vector.astype(np.uint32)
    return sm.MaskedInput(**header, vector=vector)


# --------------------------------------------------------------------------- stage 3 (active mode)


def consistency_request_to_proto(m: sm.ConsistencyRequest, ids: RoundIds) -> secagg_pb2.ConsistencyCheckRequest:
    return secagg_pb2.ConsistencyCheckRequest(
        **_header_to_proto(m, ids), survivors=_to_device_list(m.alive, ids, "ConsistencyCheckRequest.survivors")
    )


def consistency_request_from_proto(p: secagg_pb2.ConsistencyCheckRequest, ids: RoundIds) -> sm.ConsistencyRequest:
    """Client side. U3 is the WHOLE survivor set (secagg signs all of it),
    so in a sparse graph `ids` must be the full cohort map: build it from
    RoundTask.cohort (sent when the consistency check is on)."""
    what = "ConsistencyCheckRequest"
    header = _header_from_proto(p, ids, what)
    return sm.ConsistencyRequest(**header, alive=_device_list(p.survivors, ids, f"{what}.survivors"))


def consistency_check_to_proto(m: sm.ConsistencySignature, ids: RoundIds) -> secagg_pb2.ConsistencyCheck:
    return secagg_pb2.ConsistencyCheck(**_header_to_proto(m, ids), signature=_fixed(m.signature, SIGNATURE_BYTES, "signature"))


def consistency_check_from_proto(p: secagg_pb2.ConsistencyCheck, ids: RoundIds) -> sm.ConsistencySignature:
    what = "ConsistencyCheck"
    return sm.ConsistencySignature(
        **_header_from_proto(p, ids, what), signature=_fixed(p.signature, SIGNATURE_BYTES, f"{what}.signature")
    )


# --------------------------------------------------------------------------- stage 4


def unmasking_request_to_proto(m: sm.UnmaskingRequest, ids: RoundIds) -> secagg_pb2.UnmaskingRequest:
    what = "UnmaskingRequest"
    sigs = sorted(
        (secagg_pb2.ConsistencySignature(device_id=_did(ids, s, what), signature=sig) for s, sig in m.signatures),
        key=lambda x: x.device_id,
    )
    return secagg_pb2.UnmaskingRequest(
        **_header_to_proto(m, ids),
        alive=_to_device_list(m.alive, ids, f"{what}.alive"),
        dropped=_to_device_list(m.dropped, ids, f"{what}.dropped"),
        signatures=sigs,
    )


def unmasking_request_from_proto(p: secagg_pb2.UnmaskingRequest, ids: RoundIds) -> sm.UnmaskingRequest:
    what = "UnmaskingRequest"
    header = _header_from_proto(p, ids, what)
    _bounded(p.signatures, ids, f"{what}.signatures")
    sigs = tuple(
        (_sid(ids, s.device_id, f"{what}.signatures"), _fixed(s.signature, SIGNATURE_BYTES, f"{what}.signature"))
        for s in p.signatures
    )
    return sm.UnmaskingRequest(
        **header,
        alive=_device_list(p.alive, ids, f"{what}.alive"),
        dropped=_device_list(p.dropped, ids, f"{what}.dropped"),
        signatures=sigs,
    )


def unmasking_response_to_proto(m: sm.UnmaskingResponse, ids: RoundIds) -> secagg_pb2.UnmaskingResponse:
    what = "UnmaskingResponse"

    def shares(items: Iterable[tuple[int, int]]) -> list[secagg_pb2.SecretShare]:
        out = []
        for owner, value in items:
            if not (isinstance(value, int) and 0 <= value < PRIME):
                raise WireError(f"{what}: share of {owner} is not a field element")
            out.append(secagg_pb2.SecretShare(owner=_did(ids, owner, what), share=value.to_bytes(SHARE_BYTES, "big")))
        return out

    return secagg_pb2.UnmaskingResponse(
        **_header_to_proto(m, ids), b_shares=shares(m.b_shares), s_sk_shares=shares(m.s_shares)
    )


def unmasking_response_from_proto(p: secagg_pb2.UnmaskingResponse, ids: RoundIds) -> sm.UnmaskingResponse:
    what = "UnmaskingResponse"
    header = _header_from_proto(p, ids, what)

    def shares(items: Sequence[secagg_pb2.SecretShare], field: str) -> tuple[tuple[int, int], ...]:
        _bounded(items, ids, f"{what}.{field}")
        out = []
        for s in items:
            raw = _fixed(s.share, SHARE_BYTES, f"{what}.{field}.share")
            value = int.from_bytes(raw, "big")
            if value >= PRIME:
                raise WireError(f"{what}.{field}: share of {s.owner} is not a field element")
            out.append((_sid(ids, s.owner, f"{what}.{field}.owner"), value))
        return tuple(out)

    return sm.UnmaskingResponse(**header, b_shares=shares(p.b_shares, "b_shares"), s_shares=shares(p.s_sk_shares, "s_sk_shares"))


# --------------------------------------------------------------------------- aborts


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
        **_header_to_proto(m, ids), reason=abort_reason_to_proto(m.reason), detail=_detail(m.reason, detail)
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


def client_abort_from_proto(p: common_pb2.AbortNotice, ids: RoundIds) -> sm.ClientAbort:
    """Server side: a device withdraws (device_id must be set; see expand_abort)."""
    what = "AbortNotice"
    if len(p.detail) > MAX_DETAIL_CHARS:
        raise WireError(f"{what}.detail is longer than {MAX_DETAIL_CHARS} characters")
    return sm.ClientAbort(**_header_from_proto(p, ids, what), reason=abort_reason_from_proto(p.reason, p.detail))


def server_abort_from_proto(p: common_pb2.AbortNotice, ids: RoundIds) -> sm.ServerAbort:
    """Client side: the round (or this device's part) is over. A notice with
    device_id 0 must be expanded first (expand_abort)."""
    what = "AbortNotice"
    if len(p.detail) > MAX_DETAIL_CHARS:
        raise WireError(f"{what}.detail is longer than {MAX_DETAIL_CHARS} characters")
    return sm.ServerAbort(**_header_from_proto(p, ids, what), reason=abort_reason_from_proto(p.reason, p.detail))


# --------------------------------------------------------------------------- dispatch

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
