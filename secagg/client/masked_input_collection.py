"""Client stage 2, MaskedInputCollection: on the MaskingRequest, send

    y_v = x_v + PRG(b_v) + sum_{u in P, v < u} PRG(s_vu) - sum_{u in P, u < v} PRG(s_vu)   (mod 2^32)

where P is the set of peers the server named: a subset of the senders whose
shares were relayed to v, without any sender v itself reported as
undecryptable (v must hold a share of every peer it masks with, or that
peer's masks could not be removed should it drop). P is kept as
`masked_with`: the unmasking request may only name ids from it.
"""

from __future__ import annotations

from secagg.client.base import ClientState, Reject, Transition, check_ids
from secagg.client.consistency_check import ClientConsistencyCheck
from secagg.client.unmasking import ClientUnmasking
from secagg.errors import AbortReason, MalformedMessage
from secagg.keys import agree, pairwise_mask_key, self_mask_key
from secagg.messages import MaskedInput, MaskingRequest
from secagg.prg import MaskGenerator
from secagg.stages import Stage

_BAD = AbortReason.INVALID_MASKING_REQUEST


class ClientMaskedInputCollection(ClientState[MaskingRequest]):
    """Waits for the MaskingRequest (the peers to mask with).

    Checks (else ClientAborted(INVALID_MASKING_REQUEST)): the peers are
    distinct ids whose shares were relayed to this device, none that this
    device reported as undecryptable, and with this device at least t.
    """

    stage = Stage.MASKED_INPUT
    expects = MaskingRequest
    __slots__ = ()

    def _on_message(self, message: MaskingRequest) -> Transition:
        r = self._round
        cfg = r.config
        v = r.device_id
        sid, rnd = cfg.session_id, r.round_idx
        peers = frozenset(check_ids(message.peers, cfg.num_clients, "peers", _BAD))
        if not peers <= r.relayed:
            raise Reject(_BAD, "peers whose shares were not relayed to this device")
        if peers & r.undecryptable:
            raise Reject(_BAD, "peers this device reported as undecryptable")
        if len(peers) + 1 < cfg.threshold:
            raise Reject(_BAD, f"{len(peers)} peers: with this device, fewer than t={cfg.threshold}")
        r.masked_with = peers

        y = r.input().copy()
        gen = MaskGenerator(cfg.vector_length)
        gen.add(y, self_mask_key(r.b_seed, session_id=sid, round_idx=rnd, owner=v))
        s_private = r.s_keys().private
        for u in sorted(peers):
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
        msg = MaskedInput(**self._header(), vector=y)
        if cfg.active_adversary:
            return ClientConsistencyCheck(r), [msg]
        return ClientUnmasking(r), [msg]
