"""Stage 0 (advertise keys): AdvertiseKeys both ways, KeyList <-> AdvertisedKeys.

    secagg (0-based ids)        proto (enrolled device ids)      direction
    AdvertiseKeys           <-> AdvertiseKeys                    client -> server
    KeyList                 <-> AdvertisedKeys (self excluded)   server -> client

In active-adversary mode AdvertisedKeys also carries each peer's identity
public key, which secagg's KeyList does not: `key_list_to_proto` takes them
and `key_list_from_proto` returns them beside the KeyList.
"""

from __future__ import annotations

from collections.abc import Mapping

from fedmask_proto.v1 import secagg_pb2
from secagg import messages as sm
from wire.errors import WireError
from wire.ids import RoundIds
from wire.protocol import IDENTITY_KEY_BYTES, PUBLIC_KEY_BYTES
from wire.secagg_codec import fields


def advertise_keys_to_proto(m: sm.AdvertiseKeys, ids: RoundIds) -> secagg_pb2.AdvertiseKeys:
    return secagg_pb2.AdvertiseKeys(
        **fields.header_to_proto(m, ids),
        c_pk=fields.fixed(m.c_public, PUBLIC_KEY_BYTES, "c_pk"),
        s_pk=fields.fixed(m.s_public, PUBLIC_KEY_BYTES, "s_pk"),
        signature=fields.optional_signature(m.signature, "signature"),
    )


def advertise_keys_from_proto(p: secagg_pb2.AdvertiseKeys, ids: RoundIds) -> sm.AdvertiseKeys:
    what = "AdvertiseKeys"
    return sm.AdvertiseKeys(
        **fields.header_from_proto(p, ids, what),
        c_public=fields.fixed(p.c_pk, PUBLIC_KEY_BYTES, f"{what}.c_pk"),
        s_public=fields.fixed(p.s_pk, PUBLIC_KEY_BYTES, f"{what}.s_pk"),
        signature=fields.optional_signature(p.signature, f"{what}.signature"),
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
                device_id=fields.to_device_id(ids, e.device_id, what),
                c_pk=e.c_public,
                s_pk=e.s_public,
                signature=e.signature,
                identity_public_key=ident,
            )
        )
    peers.sort(key=lambda p: p.device_id)
    return secagg_pb2.AdvertisedKeys(**fields.header_to_proto(m, ids), peers=peers)


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
    header = fields.header_from_proto(p, ids, what)
    if header["device_id"] != own.device_id:
        raise WireError(f"{what} is for device {p.device_id}, not the device whose keys were given")
    fields.bounded(p.peers, ids, f"{what}.peers")
    entries = [sm.KeyEntry(own.device_id, own.c_public, own.s_public, own.signature)]
    identity: dict[int, bytes] = {}
    if own_identity_public_key is not None:
        identity[own.device_id] = fields.fixed(own_identity_public_key, IDENTITY_KEY_BYTES, "own_identity_public_key")
    for peer in p.peers:
        if peer.device_id == p.device_id:
            raise WireError(f"{what} lists the addressee itself")
        sid = fields.to_secagg_id(ids, peer.device_id, f"{what}.peers")
        entries.append(
            sm.KeyEntry(
                sid,
                fields.fixed(peer.c_pk, PUBLIC_KEY_BYTES, f"{what}.peers.c_pk"),
                fields.fixed(peer.s_pk, PUBLIC_KEY_BYTES, f"{what}.peers.s_pk"),
                fields.optional_signature(peer.signature, f"{what}.peers.signature"),
            )
        )
        if peer.identity_public_key:
            identity[sid] = fields.fixed(peer.identity_public_key, IDENTITY_KEY_BYTES, f"{what}.peers.identity_public_key")
    entries.sort(key=lambda e: e.device_id)
    return sm.KeyList(**header, entries=tuple(entries)), identity


