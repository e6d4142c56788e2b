"""Client stage 1, ShareKeys: on the server's KeyList, check it, split b_u
and s_u^SK (and, with removable noise, the m component seeds)
t-of-|closure| among the advertised closure, and send each peer its shares
sealed with the directional c-agreement key."""

from __future__ import annotations

from secagg import identity, shamir
from secagg.aead import seal, share_associated_data
from secagg.client.base import ClientState, Reject, Transition
from secagg.client.share_check import ClientShareCheck
from secagg.errors import AbortReason, MalformedMessage
from secagg.keys import PUBLIC_KEY_BYTES, SEED_BYTES, agree, share_key
from secagg.messages import KeyEntry, KeyList, ShareKeys
from secagg.stages import Stage

_BAD = AbortReason.INVALID_KEY_LIST


class ClientShareKeys(ClientState[KeyList]):
    """Waits for the KeyList (advertised keys of this device's closure).

    Checks (else ClientAborted(INVALID_KEY_LIST / INVALID_SIGNATURE)): every
    entry is a distinct member of the closure N[v]; our own entry is there
    with our own keys; at least t entries; all 2m public keys distinct (no
    key reflected back or reused); in active mode every peer's signature
    verifies under its identity key.
    """

    stage = Stage.SHARE_KEYS
    expects = KeyList
    __slots__ = ()

    def _on_message(self, message: KeyList) -> Transition:
        r = self._round
        cfg = r.config
        v = r.device_id
        closure = r.graph.closure(v)
        entries: dict[int, KeyEntry] = {}
        if not isinstance(message.entries, tuple | list):
            raise Reject(_BAD, "entries is not a list")
        for e in message.entries:
            if not isinstance(e, KeyEntry) or not isinstance(e.device_id, int):
                raise Reject(_BAD, "malformed entry")
            if e.device_id not in closure:
                raise Reject(_BAD, f"device {e.device_id} is not in this device's neighbourhood")
            if e.device_id in entries:
                raise Reject(_BAD, f"device {e.device_id} listed twice")
            if not (isinstance(e.c_public, bytes) and isinstance(e.s_public, bytes)
                    and len(e.c_public) == PUBLIC_KEY_BYTES and len(e.s_public) == PUBLIC_KEY_BYTES):
                raise Reject(_BAD, f"malformed keys for device {e.device_id}")
            entries[e.device_id] = e
        own = entries.get(v)
        if own is None or own.c_public != r.c_keys().public or own.s_public != r.s_keys().public:
            raise Reject(_BAD, "this device's own keys are missing or altered")
        if len(entries) < cfg.threshold:
            raise Reject(_BAD, f"{len(entries)} advertised devices in the neighbourhood, fewer than t={cfg.threshold}")
        all_keys = [e.c_public for e in entries.values()] + [e.s_public for e in entries.values()]
        if len(set(all_keys)) != len(all_keys):
            raise Reject(_BAD, "two advertised public keys are equal")
        if cfg.active_adversary:
            for u, e in entries.items():
                if u == v:
                    continue
                payload = identity.advertise_payload(cfg.session_id, r.round_idx, u, e.c_public, e.s_public)
                if not identity.verify(r.peer_identity_key(u), e.signature, payload):
                    raise Reject(AbortReason.INVALID_SIGNATURE, f"bad key signature of device {u}")

        # Secrets: b_u (self-mask seed) and s_u^SK, shared among the closure.
        holders = sorted(entries)
        r.b_seed = r.rand(SEED_BYTES)
        b_shares, s_shares, *component_shares = shamir.split(
            [shamir.secret_to_int(r.b_seed), shamir.secret_to_int(r.s_keys().private_bytes()),
             *(shamir.secret_to_int(c) for c in r.removable_seeds)],
            [shamir.x_of(u) for u in holders],
            cfg.threshold,
            r.rand,
        )
        sid, rnd = cfg.session_id, r.round_idx
        c_private = r.c_keys().private
        out: list[tuple[int, bytes]] = []
        for i, u in enumerate(holders):
            if u == v:
                r.own_b_share = b_shares[i]
                r.own_component_shares = tuple(c[i] for c in component_shares)
                continue
            try:
                shared = agree(c_private, entries[u].c_public)
            except MalformedMessage:
                raise Reject(_BAD, f"device {u} advertised an invalid key") from None
            r.receive_keys[u] = share_key(shared, session_id=sid, round_idx=rnd, sender=u, receiver=v)
            key = share_key(shared, session_id=sid, round_idx=rnd, sender=v, receiver=u)
            plaintext = b"".join(shamir.element_to_bytes(x[i]) for x in (b_shares, s_shares, *component_shares))
            out.append((u, seal(key, plaintext, share_associated_data(sid, rnd, v, u), r.rand)))
        del entries[v]
        r.peers = entries
        return ClientShareCheck(r), [ShareKeys(**self._header(), shares=tuple(out))]
