"""Server stage 1, ShareKeys: collect the sealed shares and relay them."""

from __future__ import annotations

from secagg.aead import sealed_length
from secagg.errors import AbortReason, DropReason
from secagg.messages import Message, ShareKeys, ShareRelay
from secagg.server.base import Drop, PruneRule, PruningState, Transition
from secagg.server.share_check import ServerShareCheck
from secagg.shamir import ELEMENT_BYTES
from secagg.stages import Stage


def sealed_shares_bytes(components: int = 0) -> int:
    """One sealed blob: the b- and s-shares, then one share per removable
    noise component (`SecAggConfig.removable_components`)."""
    return sealed_length((2 + components) * ELEMENT_BYTES)


#: One sealed (b, s) share pair, without removable noise (94 bytes).
SEALED_SHARES_BYTES = sealed_shares_bytes(0)


class ServerShareKeys(PruningState[ShareKeys]):
    """Expects U1. A device is dropped unless its ShareKeys has exactly one
    sealed blob of the right size for each of its neighbours in U1 (no
    duplicate, no unknown or missing receiver).

    close(): U2 = accepted devices, pruned like U1; |U2| < t aborts with
    TOO_FEW_SHARED. Each v in U2 is relayed the blobs addressed to it by its
    neighbours in U2; these senders are R(v), the peers v will mask with
    unless the share check (ServerShareCheck) removes some.
    """

    stage = Stage.SHARE_KEYS
    expects = ShareKeys
    rule = PruneRule("fewer than t key-sharing devices in its closure", AbortReason.TOO_FEW_SHARED, "shared keys")
    __slots__ = ()

    def _accept(self, sender: int, message: ShareKeys) -> None:
        r = self._round
        expected = r.graph.neighbors(sender) & r.u1
        if not isinstance(message.shares, tuple | list):
            raise Drop(DropReason.MALFORMED_MESSAGE, "shares is not a list")
        blobs: dict[int, bytes] = {}
        size = sealed_shares_bytes(r.config.removable_components)
        for item in message.shares:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise Drop(DropReason.MALFORMED_MESSAGE, "malformed share entry")
            receiver, sealed = item
            if not isinstance(receiver, int) or receiver not in expected:
                raise Drop(DropReason.MALFORMED_MESSAGE, f"shares for {receiver!r}, not an advertised neighbour")
            if receiver in blobs:
                raise Drop(DropReason.MALFORMED_MESSAGE, f"two share blobs for device {receiver}")
            if not (isinstance(sealed, bytes) and len(sealed) == size):
                raise Drop(DropReason.MALFORMED_MESSAGE, f"share blob for {receiver} is not {size} bytes")
            blobs[receiver] = sealed
        if len(blobs) != len(expected):
            raise Drop(DropReason.MALFORMED_MESSAGE, f"shares for {len(blobs)} of {len(expected)} neighbours")
        r.sealed[sender] = blobs

    def _record(self, survivors: frozenset[int]) -> None:
        self._round.u2 = survivors

    def _advance(self, u2: frozenset[int], out: list[Message]) -> Transition:
        r = self._round
        for v in sorted(u2):
            senders = sorted(r.graph.neighbors(v) & u2)
            r.relayed[v] = frozenset(senders)
            out.append(ShareRelay(**self._header(v), shares=tuple((u, r.sealed[u][v]) for u in senders)))
        r.sealed.clear()
        return ServerShareCheck(r, u2), out
