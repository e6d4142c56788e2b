"""Server stage 2, MaskedInputCollection: add the masked inputs as they come."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from secagg.errors import AbortReason, DropReason
from secagg.messages import ConsistencyRequest, MaskedInput, Message
from secagg.server.base import Drop, ServerRound, ServerState, Transition
from secagg.server.consistency_check import ServerConsistencyCheck
from secagg.server.unmasking import start_unmasking
from secagg.stages import Stage


class ServerMaskedInputCollection(ServerState[MaskedInput]):
    """Expects U2 (as the share check left it). A device is dropped if its
    vector is not a 1-D np.uint32 of length L. An accepted vector is added to
    the running sum at once (uint32 wraparound) and the device is counted: U3.

    close(), with D = U2 - U3 and the holders H(u) of a device's shares (u
    itself and the peers that mask with u, all of which opened u's shares),
    aborts with TOO_FEW_MASKED_INPUTS unless
      - |U3| >= t,
      - every v in U3 has >= t of U3 among itself and R(v) (the check each
        device repeats before unmasking), and
      - every u whose secret is needed (b_u for u in U3; s_u for u in D that
        some v in U3 masked with) has >= t holders still in the round.
    Then (passive mode) each live v in U3 gets its UnmaskingRequest: alive =
    U3 among itself and R(v), dropped = D among R(v). In active mode each gets
    a ConsistencyRequest with U3 first.
    """

    stage = Stage.MASKED_INPUT
    expects = MaskedInput
    __slots__ = ()

    def __init__(self, rnd: ServerRound, expected: Iterable[int]) -> None:
        super().__init__(rnd, expected)
        rnd.accumulator = np.zeros(rnd.config.vector_length, dtype=np.uint32)

    def _accept(self, sender: int, message: MaskedInput) -> None:
        r = self._round
        vec = message.vector
        if not isinstance(vec, np.ndarray) or vec.dtype != np.uint32 or vec.shape != (r.config.vector_length,):
            shape = getattr(vec, "shape", None)
            dtype = getattr(vec, "dtype", type(vec).__name__)
            raise Drop(
                DropReason.MALFORMED_MESSAGE,
                f"masked input must be uint32 of shape ({r.config.vector_length},), got {dtype} {shape}",
            )
        acc = r.sum_so_far()
        np.add(acc, vec, out=acc)

    def _close(self) -> Transition:
        r = self._round
        cfg = r.config
        t = cfg.threshold
        u3 = frozenset(self._answered)  # counted, even if the device left since
        r.u3 = u3
        r.survivors[self.stage] = tuple(sorted(u3))
        dropped_after_sharing = r.u2 - u3
        needs_s = frozenset(u for u in dropped_after_sharing if r.relayed[u] & u3)
        r.needs_s = needs_s
        if len(u3) < t:
            return self._abort(AbortReason.TOO_FEW_MASKED_INPUTS, f"{len(u3)} masked inputs, t={t}")
        for v in sorted(u3):
            if len((r.relayed[v] | {v}) & u3) < t:
                return self._abort(
                    AbortReason.TOO_FEW_MASKED_INPUTS, f"device {v} has fewer than t={t} counted devices nearby"
                )
        asked = self._live(u3)
        for u in sorted(u3 | needs_s):
            if len(r.holders(u, r.relayed[u] & asked | ({u} & asked))) < t:
                return self._abort(
                    AbortReason.TOO_FEW_MASKED_INPUTS, f"fewer than t={t} live holders of device {u}'s shares"
                )
        if cfg.active_adversary:
            alive = tuple(sorted(u3))
            out: list[Message] = [ConsistencyRequest(**self._header(v), alive=alive) for v in sorted(asked)]
            return ServerConsistencyCheck(r, asked), out
        return start_unmasking(self, r, asked)
