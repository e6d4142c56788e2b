"""Server stage 3 (active-adversary mode only), ConsistencyCheck: collect
each device's signature of U3 and forward them before unmasking."""

from __future__ import annotations

from secagg import identity
from secagg.errors import AbortReason, DropReason
from secagg.messages import ConsistencySignature
from secagg.server.base import Drop, ServerState, Transition
from secagg.server.unmasking import start_unmasking
from secagg.stages import Stage


class ServerConsistencyCheck(ServerState[ConsistencySignature]):
    """Expects the live members of U3. A device whose signature of
    (session, round, U3) does not verify under its identity key is dropped.

    close(): the signers are U4. |U4| < t aborts with TOO_FEW_SIGNATURES.
    A live signer v is asked to unmask only if >= t signers lie in its closure
    (it checks that); the others are dropped (TOO_FEW_SIGNERS_NEARBY). If some
    needed secret is left with fewer than t asked holders, TOO_FEW_SIGNATURES.
    Each asked v receives the signatures of the signers in its closure.
    """

    stage = Stage.CONSISTENCY_CHECK
    expects = ConsistencySignature
    __slots__ = ()

    def _accept(self, sender: int, message: ConsistencySignature) -> None:
        r = self._round
        payload = identity.consistency_payload(r.config.session_id, r.round_idx, r.u3)
        if not identity.verify(r.identity_key(sender), message.signature, payload):
            raise Drop(DropReason.INVALID_SIGNATURE, "consistency signature does not verify")
        r.signatures[sender] = message.signature

    def _close(self) -> Transition:
        r = self._round
        t = r.config.threshold
        signers = frozenset(r.signatures)
        r.survivors[self.stage] = tuple(sorted(signers))
        if len(signers) < t:
            return self._abort(AbortReason.TOO_FEW_SIGNATURES, f"{len(signers)} consistency signatures, t={t}")
        asked = set()
        for v in sorted(self._live(signers)):
            if len(r.graph.closure(v) & signers) >= t:
                asked.add(v)
            else:
                self._drop(v, DropReason.TOO_FEW_SIGNERS_NEARBY, f"fewer than t={t} signers in its closure")
        for u in sorted(r.u3 | r.needs_s):
            if len(r.holders(u, r.relayed[u] & asked | ({u} & asked))) < t:
                return self._abort(AbortReason.TOO_FEW_SIGNATURES, f"fewer than t={t} signers hold device {u}'s shares")
        signatures = {
            v: tuple((s, r.signatures[s]) for s in sorted(r.graph.closure(v) & signers)) for v in asked
        }
        return start_unmasking(self, r, asked, signatures)
