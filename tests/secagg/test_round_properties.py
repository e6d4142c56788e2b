"""Property test: any dropout pattern gives the exact sum, or aborts exactly
when a threshold is violated.

The oracle below restates the protocol's survivor rules independently of the
implementation (sets only, no cryptography):

  U1 = prune(advertised)            U2 = prune(U1 - silent at share_keys)
  A  = U2 - silent at share_check   (they sent a receipt)
  E(v) = N(v) & A, minus every u such that the blob u -> v or v -> u was
         garbled (v, resp. u, reported it)
  U2' = prune_E(A)                  abort at share_check if |U2'| < t
  U3 = U2' - silent at masked_input R(v) = E(v) & U2' (the peers v masks with)
  S  = {u in U2' - U3 : R(u) & U3}  (their pairwise masks must be removed)
  abort at masked input unless |U3| >= t and every v in U3 has
      |(R(v) | {v}) & U3| >= t, and every u in S has |R(u) & U3| >= t
  [active: W = U3 - silent at consistency_check; abort unless |W| >= t;
   A = {v in W : |N[v] & W| >= t}; every u in U3 | S keeps t holders in A]
  U5 = asked - silent at unmasking; abort unless every u in U3 has
      |(R(u) | {u}) & U5| >= t and every u in S has |R(u) & U5| >= t
  else: the result is sum_{v in U3} encode(x_v), bit for bit.

prune(S) is the largest subset in which every member has >= t of its closure
(prune_E: the closure in the graph E).

A garbled blob is a sealed share pair a device replaced with random bytes of
the right length before sending its ShareKeys (a hostile sender): the
receiver cannot open it and reports it at the share check.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from secagg.config import SecAggConfig
from secagg.errors import AbortReason
from secagg.graph import majority_threshold
from secagg.messages import Message, ShareKeys, UnmaskingResponse
from secagg.testing import DROPOUT_STAGES, DropoutPlan, encode_inputs, run_round


@dataclass
class Expected:
    ok: bool
    stage: str | None = None
    reason: AbortReason | None = None
    survivors: dict[str, tuple[int, ...]] = field(default_factory=dict)
    counted: tuple[int, ...] = ()


def _prune(graph, members: set[int], t: int) -> set[int]:
    members = set(members)
    changed = True
    while changed:
        changed = False
        for v in sorted(members):
            if len(graph.closure(v) & members) < t:
                members.discard(v)
                changed = True
    return members


def _prune_edges(edges: dict[int, set[int]], members: set[int], t: int) -> set[int]:
    members = set(members)
    changed = True
    while changed:
        changed = False
        for v in sorted(members):
            if len(edges[v] & members) + 1 < t:
                members.discard(v)
                changed = True
    return members


def oracle(
    config: SecAggConfig, plan: DropoutPlan, round_idx: int, garbled: frozenset[tuple[int, int]] = frozenset()
) -> Expected:
    n, t, g = config.num_clients, config.threshold, config.graph(round_idx)
    surv: dict[str, tuple[int, ...]] = {}
    u1 = _prune(g, set(range(n)) - plan.advertise_keys, t)
    surv["advertise_keys"] = tuple(sorted(u1))
    if len(u1) < t:
        return Expected(False, "advertise_keys", AbortReason.TOO_FEW_ADVERTISED, surv)
    u2 = _prune(g, u1 - plan.share_keys, t)
    surv["share_keys"] = tuple(sorted(u2))
    if len(u2) < t:
        return Expected(False, "share_keys", AbortReason.TOO_FEW_SHARED, surv)
    checked = u2 - plan.share_check
    edges = {v: set(g.neighbors(v) & checked) for v in checked}
    for sender, receiver in garbled:
        if receiver in checked and sender in checked and sender in edges[receiver]:
            edges[receiver].discard(sender)
            edges[sender].discard(receiver)
    u2 = _prune_edges(edges, checked, t)
    surv["share_check"] = tuple(sorted(u2))
    if len(u2) < t:
        return Expected(False, "share_check", AbortReason.TOO_FEW_CHECKED, surv)
    u3 = u2 - plan.masked_input
    surv["masked_input"] = tuple(sorted(u3))
    R = {v: edges[v] & u2 for v in u2}
    s_needed = {u for u in u2 - u3 if R[u] & u3}
    mi = ("masked_input", AbortReason.TOO_FEW_MASKED_INPUTS)
    if len(u3) < t or any(len((R[v] | {v}) & u3) < t for v in u3):
        return Expected(False, *mi, surv)
    if any(len(R[u] & u3) < t for u in s_needed):
        return Expected(False, *mi, surv)
    asked = u3
    if config.active_adversary:
        signers = u3 - plan.consistency_check
        surv["consistency_check"] = tuple(sorted(signers))
        cc = ("consistency_check", AbortReason.TOO_FEW_SIGNATURES)
        if len(signers) < t:
            return Expected(False, *cc, surv)
        asked = {v for v in signers if len(g.closure(v) & signers) >= t}
        if any(len((R[u] | {u}) & asked) < t for u in u3 | s_needed):
            return Expected(False, *cc, surv)
    u5 = asked - plan.unmasking
    surv["unmasking"] = tuple(sorted(u5))
    if any(len((R[u] | {u}) & u5) < t for u in u3 | s_needed):
        return Expected(False, "unmasking", AbortReason.TOO_FEW_UNMASKING_RESPONSES, surv)
    return Expected(True, survivors=surv, counted=tuple(sorted(u3)))


@st.composite
def scenarios(draw, *, max_clients: int, active: bool):
    n = draw(st.integers(2, max_clients))
    harary = n >= 4 and draw(st.booleans())
    k = 2 * draw(st.integers(1, (n - 2) // 2)) if harary else n - 1
    t = draw(st.integers(majority_threshold(k), k + 1))
    config = SecAggConfig.create(
        num_clients=n,
        vector_length=draw(st.integers(1, 12)),
        session_id=draw(st.binary(min_size=1, max_size=24)),
        clip=draw(st.sampled_from([0.5, 1.0, 4.0])),
        neighbors=k,
        threshold=t,
        modulus_bits=draw(st.sampled_from([None, 24, 32])),
        active_adversary=active,
        removable_noise=not harary and draw(st.booleans()),
    )
    stages = [s for s in DROPOUT_STAGES if active or s != "consistency_check"]
    rate = draw(st.sampled_from([0.0, 0.1, 0.25, 0.5]))
    picks = draw(st.lists(st.sampled_from(stages), min_size=n, max_size=n))
    seed = draw(st.integers(0, 2**31))
    chooser = np.random.default_rng(seed)
    plan = DropoutPlan(
        **{s: frozenset(i for i in range(n) if picks[i] == s and chooser.random() < rate) for s in stages}
    )
    garblers = [i for i in range(n) if draw(st.booleans()) and chooser.random() < rate]
    garbled = frozenset(
        (u, v) for u in garblers for v in range(n) if v != u and chooser.random() < draw(st.sampled_from([0.3, 1.0]))
    )
    return config, plan, draw(st.integers(0, 2**40)), seed, garbled


def _garble(garbled: frozenset[tuple[int, int]], seed: int):
    """A man in the middle that replaces the listed (sender, receiver) blobs
    of each ShareKeys with random bytes of the same length."""
    rng = np.random.default_rng(seed)

    def hook(sender: int, receiver: int, message: Message) -> Message | None:
        if isinstance(message, ShareKeys) and any(s == sender for s, _ in garbled):
            shares = tuple(
                (v, rng.bytes(len(blob)) if (sender, v) in garbled else blob) for v, blob in message.shares
            )
            return dataclasses.replace(message, shares=shares)
        return message

    return hook


def _check(
    config: SecAggConfig, plan: DropoutPlan, round_idx: int, seed: int,
    garbled: frozenset[tuple[int, int]] = frozenset(),
) -> None:
    rng = np.random.default_rng(seed)
    clip = config.encoding.clip
    inputs = rng.uniform(-2 * clip, 2 * clip, size=(config.num_clients, config.vector_length))
    inputs[:, 0] = clip * 10  # always clipped to the top level
    garble = _garble(garbled, seed)
    revealed: set[tuple[int, int]] = set()  # every (owner, k) whose seed share any device sent

    def intercept(sender: int, receiver: int, message: Message) -> Message | None:
        if isinstance(message, UnmaskingResponse):
            revealed.update((owner, k) for owner, k, _ in message.component_shares)
        return garble(sender, receiver, message)

    outcome = run_round(inputs, config=config, dropouts=plan, round_idx=round_idx, seed=seed, intercept=intercept)
    want = oracle(config, plan, round_idx, garbled)
    # An honest server never makes an honest device refuse anything.
    assert all(a.reason is AbortReason.SERVER_ABORTED for a in outcome.client_aborts.values()), outcome.client_aborts
    for stage, members in want.survivors.items():
        assert outcome.survivors.get(stage) == members, (stage, outcome.survivors, want.survivors)
    if not want.ok:
        assert not outcome.ok, (want, outcome.counted)
        assert (outcome.abort_stage, outcome.abort_reason) == (want.stage, want.reason), outcome.abort_detail
        return
    assert outcome.ok, (outcome.abort_stage, outcome.abort_reason, outcome.abort_detail)
    assert outcome.counted == want.counted
    assert outcome.encoded_sum is not None and outcome.mean is not None
    encoded = encode_inputs(inputs, config=config, seed=seed)
    plain = encoded[list(want.counted)].astype(np.uint64).sum(axis=0)
    assert int(plain.max()) < 2**config.encoding.modulus_bits  # the sum never wraps
    np.testing.assert_array_equal(outcome.encoded_sum.astype(np.uint64), plain)
    clipped = np.clip(inputs[list(want.counted)], -clip, clip)
    np.testing.assert_allclose(outcome.mean, clipped.mean(0), atol=config.encoding.step, rtol=0)
    _check_removed_seeds(config, want.counted, outcome.component_seeds, outcome.removed_seeds, revealed)


def _check_removed_seeds(config: SecAggConfig, counted: tuple[int, ...], given: dict[int, tuple[bytes, ...]],
                         rebuilt: dict[int, dict[int, bytes]], revealed: set[tuple[int, int]]) -> None:
    """Removable noise: with n devices, threshold t and s counted, each
    counted device gave m = n - t component seeds; exactly those k > n - s
    are rebuilt, equal to what it was given, and no device ever sent a share
    of a seed the sum keeps (k <= n - s)."""
    n, t, s = config.num_clients, config.threshold, len(counted)
    m = n - t if config.removable_noise else 0
    assert all(len(seeds) == m for seeds in given.values())
    want = {u: {k: given[u][k - 1] for k in range(n - s + 1, m + 1)} for u in counted} if m > n - s else {}
    assert {u: ks for u, ks in rebuilt.items() if ks} == want
    assert all(k > n - s for _, k in revealed), sorted(revealed)


def _events(
    config: SecAggConfig, plan: DropoutPlan, round_idx: int, seed: int,
    garbled: frozenset[tuple[int, int]] = frozenset(),
) -> None:
    event(f"outcome: {oracle(config, plan, round_idx, garbled).stage or 'ok'}")
    event(f"garbled blobs: {'yes' if garbled else 'no'}")
    event(f"graph: {'complete' if config.is_complete_graph else 'harary'}")
    if config.removable_noise:
        event(f"removable noise: {'with' if plan.masked_input else 'no'} masked-input dropouts")
    event(f"cohort: {'> 20' if config.num_clients > 20 else '<= 20'}")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(max_clients=40, active=False))
def test_exact_sum_or_abort_exactly_when_a_threshold_fails(scenario) -> None:
    _events(*scenario)
    _check(*scenario)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(max_clients=14, active=True))
def test_active_mode_exact_sum_or_abort(scenario) -> None:
    _events(*scenario)
    _check(*scenario)


def test_the_oracle_reaches_every_outcome() -> None:
    """Guard against a vacuous property test: fixed cases of each kind."""
    cfg = SecAggConfig.create(num_clients=10, vector_length=3, session_id=b"s", neighbors=4, threshold=4)
    cases = {
        "ok": DropoutPlan(),
        "advertise_keys": DropoutPlan(advertise_keys=frozenset(range(7))),
        "share_keys": DropoutPlan(share_keys=frozenset(range(7))),
        "share_check": DropoutPlan(share_check=frozenset(range(7))),
        "masked_input": DropoutPlan(masked_input=frozenset(range(0, 10, 2))),
        "unmasking": DropoutPlan(unmasking=frozenset(range(0, 10, 2))),
    }
    for name, plan in cases.items():
        want = oracle(cfg, plan, 0)
        assert (want.stage or "ok") == name, (name, want)
        _check(cfg, plan, 0, 1)
