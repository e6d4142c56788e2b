"""Server stage 4, Unmasking: collect shares, rebuild the needed secrets and
remove every mask that does not cancel:

    sum = sum_{v in U3} y_v - sum_{u in U3} PRG(b_u) + sum_{u in S} M_u      (mod 2^32)

where S is the set of devices that shared keys but sent no masked input while
some counted device masked with them, and M_u = sum_{v in U3 with u in R(v)}
sign(u, v) PRG(s_uv) (sign = +1 if u < v), i.e. exactly the pairwise masks u
would have added, recomputed from its rebuilt s_u^SK and v's advertised key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from secagg import shamir
from secagg.errors import AbortReason, DropReason
from secagg.keys import KeyPair, agree, pairwise_mask_key, self_mask_key
from secagg.messages import Message, UnmaskingRequest, UnmaskingResponse
from secagg.prg import MaskGenerator
from secagg.server.base import Drop, ServerCompleted, ServerRound, ServerState, Transition
from secagg.stages import Stage


class ServerUnmasking(ServerState[UnmaskingResponse]):
    """Expects the devices sent an UnmaskingRequest. A response is dropped
    (whole) if it has an owner it was not asked about, in the wrong list, or
    twice, or a share outside the field. Missing owners are allowed (the
    device could not open their shares).

    close(): each needed secret needs t shares, else the round aborts with
    TOO_FEW_UNMASKING_RESPONSES; a rebuilt s_u^SK must match u's advertised
    s-key and a rebuilt b_u must be 32 bytes, else RECONSTRUCTION_FAILED.
    With removable noise the same holds for each counted device's component
    seeds k > n - |U3| (a response may hold them only for its alive owners
    and those k); they go out in `ServerCompleted.removed_seeds`.
    Reconstruction uses the t shares with the smallest x, so devices with the
    same responders reuse one set of Lagrange coefficients.
    """

    stage = Stage.UNMASKING
    expects = UnmaskingResponse
    __slots__ = ("_b", "_s", "_c")

    def __init__(self, rnd: ServerRound, expected: Iterable[int]) -> None:
        super().__init__(rnd, expected)
        self._b: dict[int, dict[int, int]] = {}  # owner -> x -> share of b_owner
        self._s: dict[int, dict[int, int]] = {}  # owner -> x -> share of s_owner
        self._c: dict[tuple[int, int], dict[int, int]] = {}  # (owner, k) -> x -> share of c_owner,k

    def _accept(self, sender: int, message: UnmaskingResponse) -> None:
        alive, dropped = self._round.requests[sender]
        parsed = []
        for shares, allowed, store in ((message.b_shares, alive, self._b), (message.s_shares, dropped, self._s)):
            if not isinstance(shares, tuple | list):
                raise Drop(DropReason.MALFORMED_MESSAGE, "shares is not a list")
            seen = set()
            for item in shares:
                if not (isinstance(item, tuple) and len(item) == 2):
                    raise Drop(DropReason.MALFORMED_MESSAGE, "malformed share entry")
                owner, value = item
                if not isinstance(owner, int) or owner not in allowed or owner in seen:
                    raise Drop(DropReason.MALFORMED_MESSAGE, f"unrequested or repeated share of {owner!r}")
                if not (isinstance(value, int) and 0 <= value < shamir.PRIME):
                    raise Drop(DropReason.MALFORMED_MESSAGE, f"share of {owner} is not a field element")
                seen.add(owner)
                parsed.append((store, owner, value))
        components = self._components(message, alive)
        x = shamir.x_of(sender)
        for store, owner, value in parsed:
            store.setdefault(owner, {})[x] = value
        for key, value in components:
            self._c.setdefault(key, {})[x] = value
        # recorded as answers arrive, so a round aborted during this stage
        # (cancelled, the coordinator stopping) still lists who answered: the
        # devices that may have spent their contribution to this task (D85)
        r = self._round
        r.survivors[self.stage] = tuple(sorted({*r.survivors.get(self.stage, ()), sender}))

    def _components(self, message: UnmaskingResponse, alive: frozenset[int]) -> list[tuple[tuple[int, int], int]]:
        """The response's component shares, each of an owner in the request's
        alive list and a k that list lets go (the Drop rules of b-shares)."""
        shares = message.component_shares
        if not isinstance(shares, tuple | list):
            raise Drop(DropReason.MALFORMED_MESSAGE, "component shares is not a list")
        allowed = self._round.config.removed_components(len(alive))
        seen: set[tuple[int, int]] = set()
        out = []
        for item in shares:
            if not (isinstance(item, tuple) and len(item) == 3):
                raise Drop(DropReason.MALFORMED_MESSAGE, "malformed component share entry")
            owner, k, value = item
            key = (owner, k)
            if not (isinstance(owner, int) and isinstance(k, int)) or owner not in alive or k not in allowed \
                    or key in seen:
                raise Drop(DropReason.MALFORMED_MESSAGE, f"unrequested or repeated share of {owner!r}'s component {k!r}")
            if not (isinstance(value, int) and 0 <= value < shamir.PRIME):
                raise Drop(DropReason.MALFORMED_MESSAGE, f"share of {owner}'s component {k} is not a field element")
            seen.add(key)
            out.append((key, value))
        return out

    def _rebuild_removed(self) -> tuple[AbortReason, str] | None:
        """Every counted device's removed component seeds, into
        `removed_seeds`; else why the round must abort."""
        r = self._round
        for k in r.config.removed_components(len(r.u3)):
            for u in sorted(r.u3):
                c = self._reconstruct(self._c, (u, k))
                if c is None:
                    return AbortReason.TOO_FEW_UNMASKING_RESPONSES, \
                        f"fewer than t={r.config.threshold} shares of component {k} of {u}"
                try:
                    r.removed_seeds.setdefault(u, {})[k] = shamir.int_to_secret(c)
                except ValueError:
                    return AbortReason.RECONSTRUCTION_FAILED, f"component {k} of {u} is not a 32-byte seed"
        return None

    def _reconstruct(self, store: Mapping[Any, dict[int, int]], owner: Any) -> int | None:
        shares = store.get(owner, {})
        t = self._round.config.threshold
        if len(shares) < t:
            return None
        xs = tuple(sorted(shares)[:t])
        return shamir.combine(xs, [shares[x] for x in xs])

    def _close(self) -> Transition:
        r = self._round
        cfg = r.config
        sid, rnd = cfg.session_id, r.round_idx
        r.u5 = frozenset(self._answered)
        r.survivors[self.stage] = tuple(sorted(r.u5))
        total = r.sum_so_far()
        gen = MaskGenerator(cfg.vector_length)
        self_keys = []
        for u in sorted(r.u3):
            b = self._reconstruct(self._b, u)
            if b is None:
                return self._abort(
                    AbortReason.TOO_FEW_UNMASKING_RESPONSES, f"fewer than t={cfg.threshold} shares of b_{u}"
                )
            try:
                seed = shamir.int_to_secret(b)
            except ValueError:
                return self._abort(AbortReason.RECONSTRUCTION_FAILED, f"b_{u} is not a 32-byte seed")
            self_keys.append(self_mask_key(seed, session_id=sid, round_idx=rnd, owner=u))
        s_keys = {}
        for u in sorted(r.needs_s):
            s = self._reconstruct(self._s, u)
            if s is None:
                return self._abort(
                    AbortReason.TOO_FEW_UNMASKING_RESPONSES, f"fewer than t={cfg.threshold} shares of s_{u}"
                )
            try:
                pair = KeyPair.from_private_bytes(shamir.int_to_secret(s))
            except ValueError:
                pair = None
            if pair is None or pair.public != r.advertised[u].s_public:
                return self._abort(AbortReason.RECONSTRUCTION_FAILED, f"rebuilt s_{u} does not match its public key")
            s_keys[u] = pair.private
        failed = self._rebuild_removed()
        if failed is not None:
            return self._abort(*failed)
        for key in self_keys:
            gen.subtract(total, key)
        for u, private in s_keys.items():
            for v in sorted(r.relayed[u] & r.u3):
                shared = agree(private, r.advertised[v].s_public)
                key = pairwise_mask_key(shared, session_id=sid, round_idx=rnd, a=u, b=v)
                if u < v:
                    gen.add(total, key)
                else:
                    gen.subtract(total, key)
        r.accumulator = None
        return ServerCompleted(r, total, tuple(sorted(r.u3))), []


def start_unmasking(
    state: ServerState[Any],
    r: ServerRound,
    asked: Iterable[int],
    signatures: Mapping[int, tuple[tuple[int, bytes], ...]] | None = None,
) -> Transition:
    """Send each asked device its UnmaskingRequest; the next state collects.
    `signatures` (active mode): v -> tuple of (signer, signature) to forward."""
    out: list[Message] = []
    dropped_after_sharing = r.u2 - r.u3
    for v in sorted(asked):
        alive = (r.relayed[v] | {v}) & r.u3
        dropped = r.relayed[v] & dropped_after_sharing
        r.requests[v] = (alive, dropped)
        out.append(
            UnmaskingRequest(
                **state._header(v),
                alive=tuple(sorted(alive)),
                dropped=tuple(sorted(dropped)),
                signatures=() if signatures is None else signatures[v],
            )
        )
    return ServerUnmasking(r, asked), out
