"""Client stage 4, Unmasking: reveal, for each share owner the server lists,
the b-share (owner alive: its self-mask must go) or the s-share (owner
dropped after sharing keys: its pairwise masks must go), never both. With
removable noise, also the alive owners' shares of the component seeds
k > n - |alive|: the noise the dropouts did not take away (never a seed of
a component the sum keeps)."""

from __future__ import annotations

from secagg import identity
from secagg.client.base import ClientCompleted, ClientState, Reject, Transition, check_ids
from secagg.errors import AbortReason
from secagg.messages import UnmaskingRequest, UnmaskingResponse
from secagg.stages import Stage

_BAD = AbortReason.INVALID_UNMASKING_REQUEST


class ClientUnmasking(ClientState[UnmaskingRequest]):
    """Waits for the UnmaskingRequest. The malicious-server checks (else
    ClientAborted(INVALID_UNMASKING_REQUEST), nothing revealed):

    - ids are cohort ids, with no duplicate in either list;
    - no id is both alive and dropped;
    - this device is listed alive and not dropped;
    - every listed id is this device or a peer it masked with (whose shares it
      was relayed and kept after the share check)
      (an unknown id is refused, not skipped);
    - at least t alive devices (all in this device's closure, by the previous
      check), so the server cannot isolate a small group;
    - active mode: alive is within the U3 this device signed and dropped is
      outside it, and the request carries valid consistency signatures over
      that U3 from at least t distinct members of this device's closure
      (else INVALID_SIGNATURE).

    A state answers once, then is spent: one response per round, so a device
    never gives both shares of one peer. Owners whose shares failed to
    decrypt are skipped.
    """

    stage = Stage.UNMASKING
    expects = UnmaskingRequest
    __slots__ = ()

    def _on_message(self, message: UnmaskingRequest) -> Transition:
        r = self._round
        cfg = r.config
        v = r.device_id
        n = cfg.num_clients
        alive = check_ids(message.alive, n, "the alive list", _BAD)
        dropped = check_ids(message.dropped, n, "the dropped list", _BAD)
        alive_set, dropped_set = frozenset(alive), frozenset(dropped)
        if v in dropped_set:
            raise Reject(_BAD, "this device is listed as dropped")
        if alive_set & dropped_set:
            raise Reject(_BAD, f"devices {sorted(alive_set & dropped_set)} listed both alive and dropped")
        if v not in alive_set:
            raise Reject(_BAD, "this device is not listed alive")
        unknown = (alive_set | dropped_set) - r.masking_peers() - {v}
        if unknown:
            raise Reject(_BAD, f"devices {sorted(unknown)} never shared keys with this device")
        if len(alive_set) < cfg.threshold:
            raise Reject(_BAD, f"{len(alive_set)} alive in this neighbourhood, fewer than t={cfg.threshold}")
        if cfg.active_adversary:
            self._check_consistency(message, alive_set, dropped_set)
        b_out = []
        for u in alive:
            if u == v:
                b_out.append((v, r.own_b_share))
            elif u in r.held:
                b_out.append((u, r.held[u][0]))
        s_out = [(u, r.held[u][1]) for u in dropped if u in r.held]
        # Removable noise: the alive owners' components above j = n - |alive| (the sum keeps 0..j of each).
        c_out = []
        for k in cfg.removed_components(len(alive_set)):
            for u in alive:
                if u == v:
                    c_out.append((v, k, r.own_component_shares[k - 1]))
                elif u in r.held_components:
                    c_out.append((u, k, r.held_components[u][k - 1]))
        msg = UnmaskingResponse(**self._header(), b_shares=tuple(b_out), s_shares=tuple(s_out),
                                component_shares=tuple(c_out))
        return ClientCompleted(r), [msg]

    def _check_consistency(self, message: UnmaskingRequest, alive: frozenset[int], dropped: frozenset[int]) -> None:
        r = self._round
        cfg = r.config
        signed = r.signed()
        if not alive <= signed or dropped & signed:
            raise Reject(_BAD, "the alive/dropped lists contradict the signed survivor set")
        if not isinstance(message.signatures, tuple | list):
            raise Reject(AbortReason.INVALID_SIGNATURE, "signatures is not a list")
        closure = r.graph.closure(r.device_id)
        payload = identity.consistency_payload(cfg.session_id, r.round_idx, signed)
        signers: set[int] = set()
        for item in message.signatures:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise Reject(AbortReason.INVALID_SIGNATURE, "malformed signature entry")
            signer, sig = item
            if not isinstance(signer, int) or signer not in signed or signer not in closure or signer in signers:
                raise Reject(AbortReason.INVALID_SIGNATURE, f"unexpected or repeated signer {signer!r}")
            if not identity.verify(r.peer_identity_key(signer), sig, payload):
                raise Reject(AbortReason.INVALID_SIGNATURE, f"bad consistency signature of device {signer}")
            signers.add(signer)
        if len(signers) < cfg.threshold:
            raise Reject(AbortReason.INVALID_SIGNATURE, f"{len(signers)} consistency signatures, fewer than t={cfg.threshold}")
