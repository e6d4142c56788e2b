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
from wire.protocol import SEALED_SHARES_BYTES
from wire.secagg_codec.fields import (
    bounded,
    device_list,
    fixed,
    header_from_proto,
    header_to_proto,
    to_device_id,
    to_device_list,
    to_secagg_id,
)


# The end of an EncryptedShare that the message's own device is: ShareKeys
# carries its device's shares to its peers ("sender"), ForwardedShares
# carries its peers' shares to it ("receiver").
_End = Literal["sender", "receiver"]
_OTHER_END: dict[_End, _End] = {"sender": "receiver", "receiver": "sender"}


def _encrypted_shares_from_proto(
    shares: Sequence[secagg_pb2.EncryptedShare], device_id: int, ids: RoundIds, what: str, own_end: _End
) -> tuple[tuple[int, bytes], ...]:
    """The (peer secagg id, sealed blob) pairs of a bounded list of
    EncryptedShares whose `own_end` is `device_id` (the message's device)."""
    bounded(shares, ids, f"{what}.shares")
    peer_end = _OTHER_END[own_end]
    out = []
    for s in shares:
        own, peer = (s.sender, s.receiver) if own_end == "sender" else (s.receiver, s.sender)
        if own != device_id:
            raise WireError(f"{what}: a share names {own_end} {own}, not {device_id}")
        out.append(
            (to_secagg_id(ids, peer, f"{what}.shares.{peer_end}"), fixed(s.ciphertext, SEALED_SHARES_BYTES, f"{what}.ciphertext"))
        )
    return tuple(out)


def share_keys_to_proto(m: sm.ShareKeys, ids: RoundIds) -> secagg_pb2.ShareKeys:
    what = "ShareKeys"
    sender = to_device_id(ids, m.device_id, what)
    return secagg_pb2.ShareKeys(
        **header_to_proto(m, ids),
        shares=[
            secagg_pb2.EncryptedShare(sender=sender, receiver=to_device_id(ids, r, what), ciphertext=blob)
            for r, blob in m.shares
        ],
    )


def share_keys_from_proto(p: secagg_pb2.ShareKeys, ids: RoundIds) -> sm.ShareKeys:
    what = "ShareKeys"
    header = header_from_proto(p, ids, what)
    return sm.ShareKeys(**header, shares=_encrypted_shares_from_proto(p.shares, p.device_id, ids, what, "sender"))


def share_relay_to_proto(m: sm.ShareRelay, ids: RoundIds) -> secagg_pb2.ForwardedShares:
    what = "ForwardedShares"
    receiver = to_device_id(ids, m.device_id, what)
    return secagg_pb2.ForwardedShares(
        **header_to_proto(m, ids),
        shares=[
            secagg_pb2.EncryptedShare(sender=to_device_id(ids, s, what), receiver=receiver, ciphertext=blob)
            for s, blob in m.shares
        ],
    )


def share_relay_from_proto(p: secagg_pb2.ForwardedShares, ids: RoundIds) -> sm.ShareRelay:
    what = "ForwardedShares"
    header = header_from_proto(p, ids, what)
    return sm.ShareRelay(**header, shares=_encrypted_shares_from_proto(p.shares, p.device_id, ids, what, "receiver"))


def share_receipt_to_proto(m: sm.ShareReceipt, ids: RoundIds) -> secagg_pb2.ShareReceipt:
    return secagg_pb2.ShareReceipt(
        **header_to_proto(m, ids),
        undecryptable=to_device_list(m.undecryptable, ids, "ShareReceipt.undecryptable"),
    )


def share_receipt_from_proto(p: secagg_pb2.ShareReceipt, ids: RoundIds) -> sm.ShareReceipt:
    what = "ShareReceipt"
    header = header_from_proto(p, ids, what)
    return sm.ShareReceipt(**header, undecryptable=device_list(p.undecryptable, ids, f"{what}.undecryptable"))


def masking_request_to_proto(m: sm.MaskingRequest, ids: RoundIds) -> secagg_pb2.MaskingRequest:
    return secagg_pb2.MaskingRequest(
        **header_to_proto(m, ids), peers=to_device_list(m.peers, ids, "MaskingRequest.peers")
    )


def masking_request_from_proto(p: secagg_pb2.MaskingRequest, ids: RoundIds) -> sm.MaskingRequest:
    what = "MaskingRequest"
    header = header_from_proto(p, ids, what)
    return sm.MaskingRequest(**header, peers=device_list(p.peers, ids, f"{what}.peers"))


