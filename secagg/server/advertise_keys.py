"""Server stage 0, AdvertiseKeys: collect each device's two public keys."""

from __future__ import annotations

from collections.abc import Mapping

from secagg import identity
from secagg.config import SecAggConfig
from secagg.errors import AbortReason, DropReason, MalformedMessage, ProtocolMisuse
from secagg.keys import PUBLIC_KEY_BYTES, KeyPair, agree
from secagg.messages import AdvertiseKeys, KeyEntry, KeyList, Message
from secagg.server.base import Drop, PruneRule, PruningState, ServerRound, Transition
from secagg.server.share_keys import ServerShareKeys
from secagg.stages import Stage

# A fixed key to test advertised keys with: agreement with a low-order point
# gives all zeros, which `agree` refuses. Its secrecy does not matter.
_PROBE = KeyPair.from_private_bytes(bytes(range(1, 33))).private


class ServerAdvertiseKeys(PruningState[AdvertiseKeys]):
    """The initial server state of a round; expects every cohort device.

    A device is dropped when its keys are malformed, equal, or not usable
    X25519 keys (low order: the agreement would be all zeros), or, in active
    mode, when its signature does not verify under its identity key
    (`identity_keys`: id -> raw Ed25519 public key, from enrollment).

    close(): U1 = accepted devices, pruned so every member keeps >= t
    advertised devices in its closure (see `prune`); |U1| < t aborts with
    TOO_FEW_ADVERTISED. Each member of U1 gets the KeyList of its closure.
    """

    stage = Stage.ADVERTISE_KEYS
    expects = AdvertiseKeys
    rule = PruneRule("fewer than t advertised devices in its closure", AbortReason.TOO_FEW_ADVERTISED, "advertised keys")
    __slots__ = ()

    def __init__(self, config: SecAggConfig, round_idx: int, *, identity_keys: Mapping[int, bytes] | None = None) -> None:
        if not isinstance(config, SecAggConfig):
            raise TypeError("config must be a SecAggConfig")
        if not (isinstance(round_idx, int) and 0 <= round_idx < 1 << 64):
            raise ValueError(f"round_idx must be a non-negative int, got {round_idx!r}")
        if config.active_adversary and identity_keys is None:
            raise ProtocolMisuse("active-adversary mode needs the cohort's identity_keys")
        rnd = ServerRound(config=config, round_idx=round_idx, graph=config.graph(round_idx), identity_keys=identity_keys)
        super().__init__(rnd, range(config.num_clients))

    def _accept(self, sender: int, message: AdvertiseKeys) -> None:
        r = self._round
        c_pk, s_pk = message.c_public, message.s_public
        if not (isinstance(c_pk, bytes) and isinstance(s_pk, bytes) and len(c_pk) == len(s_pk) == PUBLIC_KEY_BYTES):
            raise Drop(DropReason.MALFORMED_MESSAGE, "public keys must be 32 bytes")
        if c_pk == s_pk:
            raise Drop(DropReason.MALFORMED_MESSAGE, "c and s public keys are equal")
        try:
            agree(_PROBE, c_pk)
            agree(_PROBE, s_pk)
        except MalformedMessage:
            raise Drop(DropReason.MALFORMED_MESSAGE, "unusable X25519 public key") from None
        if r.config.active_adversary:
            payload = identity.advertise_payload(r.config.session_id, r.round_idx, sender, c_pk, s_pk)
            if not identity.verify(r.identity_key(sender), message.signature, payload):
                raise Drop(DropReason.INVALID_SIGNATURE, "advertised keys not signed by the device's identity key")
        elif message.signature:
            raise Drop(DropReason.MALFORMED_MESSAGE, "unexpected signature")
        r.advertised[sender] = message

    def _record(self, survivors: frozenset[int]) -> None:
        self._round.u1 = survivors

    def _advance(self, u1: frozenset[int], out: list[Message]) -> Transition:
        r = self._round
        entries = {
            v: KeyEntry(v, m.c_public, m.s_public, m.signature) for v, m in r.advertised.items() if v in u1
        }
        if r.graph.is_complete:
            everyone = tuple(entries[v] for v in sorted(u1))
            out += [KeyList(**self._header(v), entries=everyone) for v in sorted(u1)]
        else:
            for v in sorted(u1):
                mine = tuple(entries[u] for u in sorted(r.graph.closure(v) & u1))
                out.append(KeyList(**self._header(v), entries=mine))
        return ServerShareKeys(r, u1), out
