"""Property test: secure aggregation of the discrete Gaussian's residues
(D88) is exact mod 2^w, in one instance and across groups, under every
dropout pattern a threshold allows.

Under the discrete Gaussian a device's input is not the fixed-point
encoding but its noisy rotated vector's residues mod 2^w, `to_unsigned(
encode(...), w)`: any word in [0, 2^w), and sums of them wrap by design.
The oracle is independent of the implementation: the counted set comes
from the survivor rules of tests/secagg/test_round_properties.py (sets
only), the sum from Python's unbounded integers, reduced mod 2^w. The run's
unmasked sum must equal it bit for bit, and the server's decoding of it
(`dpmech.mechanism.decode_sum`) must equal the decoding of the oracle's
sum exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_grouped_round_properties import _local_plan, grouped_rounds
from test_round_properties import oracle, scenarios

from dpmech.calibrate import calibrate
from dpmech.field import to_unsigned
from dpmech.mechanism import decode_sum, encode
from dpmech.random_source import GeneratorBytes
from secagg.grouped_round import group_configs, run_grouped_round
from secagg.groups import partition, partition_seed
from secagg.inprocess import DropoutPlan, run_round


def _residues(rng: np.random.Generator, n: int, length: int, bits: int) -> np.ndarray:
    """Words over the whole field, its extremes included (0 and 2^w - 1 in column 0)."""
    x = rng.integers(0, 1 << bits, size=(n, length), dtype=np.uint64).astype(np.uint32)
    x[:, 0] = (1 << bits) - 1 if rng.random() < 0.5 else 0
    return x


def _oracle_sum(x: np.ndarray, counted: list[int] | tuple[int, ...], bits: int) -> list[int]:
    return [sum(int(x[p, j]) for p in counted) % (1 << bits) for j in range(x.shape[1])]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(max_clients=24, active=False))
def test_one_instance_sums_residues_exactly_mod_2w(scenario: tuple[Any, ...]) -> None:
    config, plan, round_idx, seed, _garbled = scenario
    bits = config.encoding.modulus_bits
    x = _residues(np.random.default_rng(seed), config.num_clients, config.vector_length, bits)
    want = oracle(config, plan, round_idx)
    event(f"outcome: {want.stage or 'ok'}")
    out = run_round(x, config=config, dropouts=plan, round_idx=round_idx, seed=seed)
    assert out.ok == want.ok, (out.abort_stage, want.stage)
    if not want.ok:
        return
    assert out.counted == want.counted and out.residues and out.sum is None
    assert out.encoded_sum is not None and out.exact
    assert [int(v) for v in out.encoded_sum] == _oracle_sum(x, want.counted, bits)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grouped_rounds())
def test_groups_sum_residues_exactly_mod_2w(scenario: tuple[Any, ...]) -> None:
    groups, configs, plan, round_idx, seed = scenario
    n, length = sum(len(g) for g in groups), configs[0].vector_length
    bits = configs[0].encoding.modulus_bits
    x = _residues(np.random.default_rng(seed), n, length, bits)
    want: list[int] = []
    committing = []
    for j, (members, cfg) in enumerate(zip(groups, configs, strict=True)):
        w = oracle(cfg, _local_plan(plan, members), round_idx)
        if w.ok:
            committing.append(j)
            want.extend(members[i] for i in w.counted)
    event(f"groups: {len(groups)}; committing: {len(committing)}")
    out = run_grouped_round(x, groups=groups, configs=configs, dropouts=plan, round_idx=round_idx, seed=seed)
    assert out.committed == tuple(committing)
    if not committing:
        assert not out.ok and out.encoded_sum is None
        return
    assert out.counted == tuple(sorted(want)) and len(set(out.counted)) == len(out.counted)
    assert out.encoded_sum is not None and out.exact and out.residues and out.sum is None
    assert [int(v) for v in out.encoded_sum] == _oracle_sum(x, want, bits)


def test_the_mechanism_through_groups_with_dropouts_decodes_as_its_oracle() -> None:
    """Devices encode with dpmech (noise that wraps on a device included), a
    round in groups sums their residues with some dropping out, and the
    server's decoding equals the decoding of the counted devices' plain sum
    mod 2^w, close to the sum of their clipped updates."""
    n, dim, bits = 24, 100, 20
    groups = partition(range(n), group_size=8, seed=partition_seed(b"dg", 3))
    mech = calibrate(dim=dim, clip=1.0, noise_multiplier=1.0, devices=n, shares=min(len(g) for g in groups), bits=bits)
    rng = np.random.default_rng(4)
    updates = rng.normal(size=(n, dim)) * 0.2
    seed = b"fedmask/dp-rotation-seed/v1\x00round"
    noise = GeneratorBytes(np.random.default_rng(5))
    x = np.stack([to_unsigned(encode(u, mech, seed, rng, noise=noise), bits).astype(np.uint32) for u in updates])
    assert x.max() >= (1 << (bits - 1))  # negative values travel as high residues
    configs = group_configs(groups, vector_length=mech.padded_dim, session_id=b"dg", modulus_bits=bits)
    plan = DropoutPlan(masked_input=frozenset({groups[0][0], groups[1][1]}))
    out = run_grouped_round(x, groups=groups, configs=configs, dropouts=plan, round_idx=3, seed=6)
    assert out.ok and out.exact and out.encoded_sum is not None
    counted = [p for p in range(n) if p not in plan.masked_input]
    assert out.counted == tuple(counted)
    oracle_words = np.array(_oracle_sum(x, counted, bits), dtype=np.uint64)
    decoded = decode_sum(out.encoded_sum, mech, seed)
    np.testing.assert_array_equal(decoded, decode_sum(oracle_words, mech, seed))
    clipped = updates * np.minimum(1.0, 1.0 / np.linalg.norm(updates, axis=1, keepdims=True))
    noise_std = np.sqrt(len(counted) * float(mech.sigma2)) / mech.scale
    assert np.abs(decoded - clipped[counted].sum(axis=0)).max() < 6 * noise_std + len(counted) / mech.scale
