"""Stage 1 (share keys) and the share check: the sealed shares on their way
from each sender through the server to each receiver, the receivers'
receipts, and the server's request to mask.

    secagg (0-based ids)        proto (enrolled device ids)      direction
    ShareKeys               <-> ShareKeys                        client -> server
    ShareRelay              <-> ForwardedShares                  server -> client
    ShareReceipt            <-> ShareReceipt                     client -> server
    MaskingRequest          <-> MaskingRequest                   server -> client
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from fedmask_proto.v1 import secagg_pb2
from secagg import messages as sm
from wire.errors import WireError
from wire.ids import RoundIds
from wire.protocol import sealed_shares_bytes
from wire.secagg_codec import fields


# The end of an EncryptedShare that the message's own device is: ShareKeys
# carries its device's shares to its peers ("sender"), ForwardedShares
# carries its peers' shares to it ("receiver").
_End = Literal["sender", "receiver"]
_OTHER_END: dict[_End, _End] = {"sender": "receiver", "receiver": "sender"}


def _encrypted_shares_to_proto(
    m: sm.ShareKeys | sm.ShareRelay, ids: RoundIds, what: str, own_end: _End
) -> list[secagg_pb2.EncryptedShare]:
    """m.shares, (peer secagg id, sealed blob) pairs, as EncryptedShares
    with m's device at `own_end` and each peer at the other."""
    own = fields.to_device_id(ids, m.device_id, what)
    out = []
    for peer, blob in m.shares:
        other = fields.to_device_id(ids, peer, what)
        sender, receiver = (own, other) if own_end == "sender" else (other, own)
        out.append(secagg_pb2.EncryptedShare(sender=sender, receiver=receiver, ciphertext=blob))
    return out


def _encrypted_shares_from_proto(
    shares: Sequence[secagg_pb2.EncryptedShare], device_id: int, ids: RoundIds, what: str, own_end: _End
) -> tuple[tuple[int, bytes], ...]:
    """The (peer secagg id, sealed blob) pairs of a bounded list of
    EncryptedShares whose `own_end` is `device_id` (the message's device)."""
    fields.bounded(shares, ids, f"{what}.shares")
    peer_end = _OTHER_END[own_end]
    out = []
    for s in shares:
        own, peer = (s.sender, s.receiver) if own_end == "sender" else (s.receiver, s.sender)
        if own != device_id:
            raise WireError(f"{what}: a share names {own_end} {own}, not {device_id}")
        peer_id = fields.to_secagg_id(ids, peer, f"{what}.shares.{peer_end}")
        out.append((peer_id, fields.fixed(s.ciphertext, sealed_shares_bytes(ids.components), f"{what}.ciphertext")))
    return tuple(out)


def share_keys_to_proto(m: sm.ShareKeys, ids: RoundIds) -> secagg_pb2.ShareKeys:
    shares = _encrypted_shares_to_proto(m, ids, "ShareKeys", "sender")
    return secagg_pb2.ShareKeys(**fields.header_to_proto(m, ids), shares=shares)


def share_keys_from_proto(p: secagg_pb2.ShareKeys, ids: RoundIds) -> sm.ShareKeys:
    what = "ShareKeys"
    header = fields.header_from_proto(p, ids, what)
    return sm.ShareKeys(**header, shares=_encrypted_shares_from_proto(p.shares, p.device_id, ids, what, "sender"))


def share_relay_to_proto(m: sm.ShareRelay, ids: RoundIds) -> secagg_pb2.ForwardedShares:
    shares = _encrypted_shares_to_proto(m, ids, "ForwardedShares", "receiver")
    return secagg_pb2.ForwardedShares(**fields.header_to_proto(m, ids), shares=shares)


def share_relay_from_proto(p: secagg_pb2.ForwardedShares, ids: RoundIds) -> sm.ShareRelay:
    what = "ForwardedShares"
    header = fields.header_from_proto(p, ids, what)
    return sm.ShareRelay(**header, shares=_encrypted_shares_from_proto(p.shares, p.device_id, ids, what, "receiver"))


def share_receipt_to_proto(m: sm.ShareReceipt, ids: RoundIds) -> secagg_pb2.ShareReceipt:
    return secagg_pb2.ShareReceipt(
        **fields.header_to_proto(m, ids),
        undecryptable=fields.to_device_list(m.undecryptable, ids, "ShareReceipt.undecryptable"),
    )


def share_receipt_from_proto(p: secagg_pb2.ShareReceipt, ids: RoundIds) -> sm.ShareReceipt:
    what = "ShareReceipt"
    header = fields.header_from_proto(p, ids, what)
    return sm.ShareReceipt(**header, undecryptable=fields.device_list(p.undecryptable, ids, f"{what}.undecryptable"))


def masking_request_to_proto(m: sm.MaskingRequest, ids: RoundIds) -> secagg_pb2.MaskingRequest:
    return secagg_pb2.MaskingRequest(
        **fields.header_to_proto(m, ids), peers=fields.to_device_list(m.peers, ids, "MaskingRequest.peers")
    )


def masking_request_from_proto(p: secagg_pb2.MaskingRequest, ids: RoundIds) -> sm.MaskingRequest:
    what = "MaskingRequest"
    header = fields.header_from_proto(p, ids, what)
    return sm.MaskingRequest(**header, peers=fields.device_list(p.peers, ids, f"{what}.peers"))


