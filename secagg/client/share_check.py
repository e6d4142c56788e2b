"""Client share check: on the ShareRelay, open the sealed shares addressed to
this device and report the senders whose shares did not decrypt.

Nothing is masked yet: the server first hears every device's report, leaves
reported senders out of the round, and then names the peers each device
masks with (MaskingRequest). So a device that seals garbage for its peers
costs itself the round and nobody else (decision D37).
"""

from __future__ import annotations

from secagg import shamir
from secagg.aead import open_sealed, share_associated_data
from secagg.client.base import ClientState, Reject, Transition
from secagg.client.masked_input_collection import ClientMaskedInputCollection
from secagg.errors import AbortReason, DecryptionError
from secagg.messages import ShareReceipt, ShareRelay
from secagg.stages import Stage

_BAD = AbortReason.INVALID_SHARE_RELAY


class ClientShareCheck(ClientState[ShareRelay]):
    """Waits for the ShareRelay (sealed shares addressed to this device).

    Checks (else ClientAborted(INVALID_SHARE_RELAY)): senders are distinct
    advertised peers; with this device they are at least t (else its own
    secrets could not be reconstructed, nor its masks removed). A ciphertext
    that fails to open (bad tag, wrong length, a field element out of range)
    is one opaque failure: the sender is listed in the ShareReceipt and this
    device holds no share of it.
    """

    stage = Stage.SHARE_CHECK
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
        elements = 2 + cfg.removable_components  # b-share, s-share, then one share per component seed
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
                if len(plaintext) != elements * shamir.ELEMENT_BYTES:
                    raise DecryptionError()
                values = [shamir.element_from_bytes(plaintext[i * shamir.ELEMENT_BYTES:(i + 1) * shamir.ELEMENT_BYTES])
                          for i in range(elements)]
                if any(x >= shamir.PRIME for x in values):
                    raise DecryptionError()
            except DecryptionError:
                undecryptable.add(u)
                continue
            r.held[u] = (values[0], values[1])
            if len(values) > 2:
                r.held_components[u] = tuple(values[2:])
        if len(seen) + 1 < cfg.threshold:
            raise Reject(_BAD, f"shares from {len(seen)} peers: with this device, fewer than t={cfg.threshold}")
        r.relayed = frozenset(seen)
        r.undecryptable = frozenset(undecryptable)
        receipt = ShareReceipt(**self._header(), undecryptable=tuple(sorted(undecryptable)))
        return ClientMaskedInputCollection(r), [receipt]
