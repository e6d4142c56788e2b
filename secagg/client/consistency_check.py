"""Client stage 3 (active-adversary mode only), ConsistencyCheck: sign the
survivor set U3 the server announces, so that every honest device unmasks
against the same U3 (Bonawitz et al., round 3 of the malicious protocol)."""

from __future__ import annotations

from secagg import identity
from secagg.client.base import ClientState, Reject, Transition, check_ids
from secagg.client.unmasking import ClientUnmasking
from secagg.errors import AbortReason
from secagg.messages import ConsistencyRequest, ConsistencySignature
from secagg.stages import Stage

_BAD = AbortReason.INVALID_CONSISTENCY_REQUEST


class ClientConsistencyCheck(ClientState[ConsistencyRequest]):
    """Waits for the ConsistencyRequest (U3, the devices whose masked input
    the server counted).

    Checks (else ClientAborted(INVALID_CONSISTENCY_REQUEST)): distinct cohort
    ids; this device is listed; every listed neighbour had its shares relayed
    here (it could not have sent a masked input otherwise; the share check
    may have removed the pair, so this is the relayed set, not the masking
    peers); at least t of
    this device's closure are listed.
    """

    stage = Stage.CONSISTENCY_CHECK
    expects = ConsistencyRequest
    __slots__ = ()

    def _on_message(self, message: ConsistencyRequest) -> Transition:
        r = self._round
        cfg = r.config
        v = r.device_id
        alive = frozenset(check_ids(message.alive, cfg.num_clients, "the survivor list", _BAD))
        if v not in alive:
            raise Reject(_BAD, "this device sent its masked input but is not listed")
        neighbours = r.graph.neighbors(v)
        stray = (alive & neighbours) - r.relayed
        if stray:
            raise Reject(_BAD, f"neighbours {sorted(stray)} listed alive never shared keys with this device")
        if len(alive & r.graph.closure(v)) < cfg.threshold:
            raise Reject(_BAD, f"fewer than t={cfg.threshold} survivors in this device's neighbourhood")
        r.signed_alive = alive
        sig = identity.sign(r.signing_key(), identity.consistency_payload(cfg.session_id, r.round_idx, alive))
        return ClientUnmasking(r), [ConsistencySignature(**self._header(), signature=sig)]
