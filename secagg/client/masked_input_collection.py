"""Client stage 2, MaskedInputCollection: on the ShareRelay, decrypt the
peers' shares and send

    y_v = x_v + PRG(b_v) + sum_{u in R, v < u} PRG(s_vu) - sum_{u in R, u < v} PRG(s_vu)   (mod 2^32)

where R is the set of peers whose ciphertexts were relayed to v (they shared
keys). A ciphertext that fails to decrypt does not change the masks (the
mask key comes from the advertised s-keys, not from the ciphertext): v keeps
masking with that peer, holds no share of it, and reports it in
`undecryptable` so the server does not count on v for that peer's secrets.
"""

from __future__ import annotations

from secagg import shamir
from secagg.aead import open_sealed, share_associated_data
from secagg.client.base import ClientState, Reject, Transition
from secagg.client.consistency_check import ClientConsistencyCheck
from secagg.client.unmasking import ClientUnmasking
from secagg.errors import AbortReason, DecryptionError, MalformedMessage
from secagg.keys import agree, pairwise_mask_key, self_mask_key
from secagg.messages import MaskedInput, ShareRelay
from secagg.prg import MaskGenerator
from secagg.stages import Stage

_BAD = AbortReason.INVALID_SHARE_RELAY
_PLAINTEXT_BYTES = 2 * shamir.ELEMENT_BYTES


class ClientMaskedInputCollection(ClientState[ShareRelay]):
    """Waits for the ShareRelay (sealed shares addressed to this device).

    Checks (else ClientAborted(INVALID_SHARE_RELAY)): senders are distinct
    advertised peers; with this device they are at least t (else its own
    secrets could not be reconstructed, nor its masks removed).
    """

    stage = Stage.MASKED_INPUT
    expects = ShareRelay
    __slots__ = ()

    def _on_message(self, message: ShareRelay) -> Transition:
        r = self._round
        cfg = r.config
        v = r.device_id
        sid, rnd = cfg.session_id, r.round_idx
        if not isinstance(message.shares, tuple | list):
            raise Reject(_BAD, "shares is not a list")
        seen: set[int] = set()
        undecryptable: set[int] = set()
        for item in message.shares:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise Reject(_BAD, "malformed relay entry")
            u, sealed = item
            if not isinstance(u, int) or u not in r.peers:
                raise Reject(_BAD, f"shares from {u!r}, who is not an advertised neighbour")
            if u in seen:
                raise Reject(_BAD, f"shares from device {u} relayed twice")
            seen.add(u)
            try:
                if not isinstance(sealed, bytes):
                    raise DecryptionError()
                plaintext = open_sealed(r.receive_keys[u], sealed, share_associated_data(sid, rnd, u, v))
                if len(plaintext) != _PLAINTEXT_BYTES:
                    raise DecryptionError()
                b_share = shamir.element_from_bytes(plaintext[: shamir.ELEMENT_BYTES])
                s_share = shamir.element_from_bytes(plaintext[shamir.ELEMENT_BYTES :])
                if b_share >= shamir.PRIME or s_share >= shamir.PRIME:
                    raise DecryptionError()
            except DecryptionError:
                undecryptable.add(u)
                continue
            r.held[u] = (b_share, s_share)
        if len(seen) + 1 < cfg.threshold:
            raise Reject(_BAD, f"shares from {len(seen)} peers: with this device, fewer than t={cfg.threshold}")
        r.relayed = frozenset(seen)
        r.undecryptable = frozenset(undecryptable)

        y = r.input().copy()
        gen = MaskGenerator(cfg.vector_length)
        gen.add(y, self_mask_key(r.b_seed, session_id=sid, round_idx=rnd, owner=v))
        s_private = r.s_keys().private
        for u in sorted(seen):
            try:
                shared = agree(s_private, r.peers[u].s_public)
            except MalformedMessage:  # the KeyList check already refused such keys
                raise Reject(AbortReason.INVALID_KEY_LIST, f"device {u} advertised an invalid key") from None
            key = pairwise_mask_key(shared, session_id=sid, round_idx=rnd, a=v, b=u)
            if v < u:
                gen.add(y, key)
            else:
                gen.subtract(y, key)
        r.encoded_input = None  # the plaintext input is no longer needed
        msg = MaskedInput(**self._header(), vector=y, undecryptable=tuple(sorted(undecryptable)))
        if cfg.active_adversary:
            return ClientConsistencyCheck(r), [msg]
        return ClientUnmasking(r), [msg]
