"""Server share check: hear which relayed shares failed to open, before
anyone masks.

A device that seals garbage for a peer leaves that peer unable to hold its
shares; if the peer then masked with it, the pair's mask could be removed
only with the sender's secret, which too few devices may hold. So the
relayed shares are checked first: every device answers the ShareRelay with
a ShareReceipt listing the senders whose shares did not open, and only then
does the server name the peers each device masks with (MaskingRequest).

The server cannot tell who is lying (the pairwise key is symmetric), so a
report removes one *pair* for this round, never a device outright: the
reporter and the reported sender do not mask with each other. A device then
goes on only while its closure still has t members (as at ShareKeys), so a
sender whose shares fail at many peers falls out of the round by itself,
and a device that reports all its peers removes its own edges and falls out
too. Reports outlive the round only through the coordinator's reputation
rule (coordinator/peer_reports.py, decision D37).
"""

from __future__ import annotations

from secagg.errors import AbortReason, DropReason
from secagg.messages import MaskingRequest, Message, ShareReceipt
from secagg.server.base import Drop, ServerState, Transition
from secagg.server.masked_input_collection import ServerMaskedInputCollection
from secagg.stages import Stage


class ServerShareCheck(ServerState[ShareReceipt]):
    """Expects U2. A device is dropped if its receipt lists repeated ids or
    ids whose shares were not relayed to it.

    close(): A = devices that sent a receipt. Each report (v lists u)
    removes the edge v-u from the relay graph; then devices whose closure
    in A has fewer than t members are dropped, repeatedly (reported ones
    with REPORTED_UNDECRYPTABLE and a SHARES_UNDECRYPTABLE notice, the
    others with NEIGHBOURHOOD_TOO_SMALL); U2 becomes what is left, and
    |U2| < t aborts with TOO_FEW_CHECKED. Each v in U2 gets its
    MaskingRequest: P(v) = its relayed senders still in U2, minus the
    edges removed; from here on `relayed[v]` is P(v).
    """

    stage = Stage.SHARE_CHECK
    expects = ShareReceipt
    __slots__ = ()

    def _accept(self, sender: int, message: ShareReceipt) -> None:
        r = self._round
        bad = message.undecryptable
        if (
            not isinstance(bad, tuple | list)
            or not all(isinstance(u, int) for u in bad)
            or len(set(bad)) != len(bad)
            or not set(bad) <= r.relayed[sender]
        ):
            raise Drop(DropReason.MALFORMED_MESSAGE, "undecryptable lists unknown or repeated ids")
        if bad:
            r.undecryptable[sender] = frozenset(bad)

    def _close(self) -> Transition:
        r = self._round
        t = r.config.threshold
        answered = self._live(self._answered)
        edges = {v: set(r.relayed[v] & answered) for v in answered}
        reported: set[int] = set()
        for v in answered:
            for u in r.undecryptable.get(v, ()):
                edges[v].discard(u)
                if u in edges:
                    edges[u].discard(v)
                reported.add(u)
        alive = set(answered)
        queue = sorted(alive)
        while queue:
            v = queue.pop()
            if v in alive and len(edges[v] & alive) + 1 < t:
                alive.discard(v)
                queue.extend(edges[v] & alive)
        out: list[Message] = []
        for v in sorted(answered - alive):
            if v in reported:
                self._drop(v, DropReason.REPORTED_UNDECRYPTABLE, "its shares did not open at enough peers")
                out += self._notices([v], AbortReason.SHARES_UNDECRYPTABLE)
            else:
                self._drop(v, DropReason.NEIGHBOURHOOD_TOO_SMALL, "fewer than t checked devices in its closure")
                out += self._notices([v], AbortReason.TOO_FEW_CHECKED)
        u2 = frozenset(alive)
        r.u2 = u2
        r.survivors[self.stage] = tuple(sorted(u2))
        if len(u2) < t:
            aborted, notices = self._abort(AbortReason.TOO_FEW_CHECKED, f"{len(u2)} devices left after the share check, t={t}")
            return aborted, out + notices
        r.relayed = {v: frozenset(edges[v] & u2) for v in sorted(u2)}
        for v in sorted(u2):
            out.append(MaskingRequest(**self._header(v), peers=tuple(sorted(r.relayed[v]))))
        return ServerMaskedInputCollection(r, u2), out
