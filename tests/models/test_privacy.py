"""DP: per-row clipping, seeded Gaussian noise, and epsilon golden values against dp_accounting."""

from __future__ import annotations

import math

import dp_accounting
import pytest
import torch
from dp_accounting import pld, rdp

from models.privacy import (
    Accountant,
    Composition,
    RoundAccountant,
    add_gaussian_noise,
    clip_rows,
    composed_epsilon,
    distributed_noise_multiplier,
    dp_event,
    epsilon,
    privatize,
)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_clip_rows_bounds_every_row_and_keeps_small_ones() -> None:
    x = torch.randn(50, 300, generator=gen()) * torch.logspace(-3, 1, 50).unsqueeze(1)
    clipped, norms = clip_rows(x, clip=0.1)
    out = torch.linalg.vector_norm(clipped, dim=1)
    assert torch.allclose(norms, torch.linalg.vector_norm(x, dim=1))
    assert (out <= 0.1 * (1 + 1e-5)).all()
    small = norms <= 0.1
    assert small.any() and (~small).any()
    assert torch.equal(clipped[small], x[small])  # untouched below the bound
    assert torch.allclose(out[~small], torch.full_like(out[~small], 0.1), rtol=1e-5)  # exactly tau above
    # direction is kept
    cos = torch.nn.functional.cosine_similarity(clipped, x, dim=1)
    assert torch.allclose(cos, torch.ones_like(cos), atol=1e-5)
    zero, _ = clip_rows(torch.zeros(2, 5), clip=1.0)
    assert torch.equal(zero, torch.zeros(2, 5))
    with pytest.raises(ValueError):
        clip_rows(x, clip=0.0)


def test_noise_std_and_determinism() -> None:
    x = torch.zeros(400, 500)
    a = add_gaussian_noise(x, std=0.3, generator=gen(4))
    b = add_gaussian_noise(x, std=0.3, generator=gen(4))
    assert torch.equal(a, b)
    assert a.std().item() == pytest.approx(0.3, rel=0.01)
    assert abs(a.mean().item()) < 0.003
    assert torch.equal(x, torch.zeros(400, 500))  # input not modified


def test_privatize_is_clip_then_noise_with_std_z_tau() -> None:
    x = torch.randn(300, 1000, generator=gen(1))
    y, norms = privatize(x, clip=0.1, noise_multiplier=1.0, generator=gen(2))
    clipped, _ = clip_rows(x, clip=0.1)
    noise = y - clipped
    assert noise.std().item() == pytest.approx(0.1, rel=0.02)
    y0, _ = privatize(x, clip=0.1, noise_multiplier=0.0, generator=gen(2))
    assert torch.allclose(y0, clipped)
    with pytest.raises(ValueError):
        privatize(x, clip=0.1, noise_multiplier=-1.0, generator=gen(2))


@pytest.mark.parametrize(
    ("z", "q", "rounds", "delta"),
    [(1.0, 1.0, 100, 1e-5), (1.1, 0.01, 1000, 1e-5), (0.8, 100 / 943, 50, 1e-6)],
)
def test_epsilon_golden_against_dp_accounting(z: float, q: float, rounds: int, delta: float) -> None:
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), rounds
    )
    acc = rdp.RdpAccountant()
    acc.compose(event)
    want_rdp = acc.get_epsilon(delta)
    acc2 = pld.PLDAccountant()
    acc2.compose(event)
    want_pld = acc2.get_epsilon(delta)
    assert epsilon(noise_multiplier=z, sampling_rate=q, rounds=rounds, delta=delta) == pytest.approx(want_rdp)
    got_pld = epsilon(noise_multiplier=z, sampling_rate=q, rounds=rounds, delta=delta, accountant="pld")
    assert got_pld == pytest.approx(want_pld)
    assert got_pld <= want_rdp * 1.01  # PLD is the tighter of the two


def test_epsilon_known_values_and_monotonicity() -> None:
    # full participation, z = 1, 100 rounds: the number FedRAP's DP run reports
    e100 = epsilon(noise_multiplier=1.0, sampling_rate=1.0, rounds=100)
    assert e100 == pytest.approx(96.1163, rel=1e-3)
    assert epsilon(noise_multiplier=1.0, sampling_rate=1.0, rounds=10) < e100
    assert epsilon(noise_multiplier=2.0, sampling_rate=1.0, rounds=100) < e100
    assert epsilon(noise_multiplier=1.0, sampling_rate=0.1, rounds=100) < e100
    assert epsilon(noise_multiplier=1.0, sampling_rate=1.0, rounds=0) == 0.0
    assert dp_event(noise_multiplier=1.0, sampling_rate=0.5, rounds=3) == dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.5, dp_accounting.GaussianDpEvent(1.0)), 3
    )
    with pytest.raises(ValueError):
        epsilon(noise_multiplier=1.0, sampling_rate=1.5, rounds=3)
    with pytest.raises(ValueError):
        epsilon(noise_multiplier=0.0, sampling_rate=1.0, rounds=3)
    with pytest.raises(ValueError):
        epsilon(noise_multiplier=1.0, sampling_rate=1.0, rounds=3, delta=0.0)


def test_round_accountant_bookkeeping() -> None:
    acc = RoundAccountant(noise_multiplier=1.0, sampling_rate=0.2, delta=1e-5)
    assert acc.epsilon() == 0.0
    for _ in range(7):
        acc.step()
    assert acc.rounds == 7
    assert acc.epsilon() == pytest.approx(epsilon(noise_multiplier=1.0, sampling_rate=0.2, rounds=7))
    assert math.isfinite(acc.epsilon())


def test_composed_epsilon_matches_epsilon_for_identical_rounds() -> None:
    accountants: tuple[Accountant, ...] = ("rdp", "pld")
    for acc in accountants:
        want = epsilon(noise_multiplier=1.0, sampling_rate=0.5, rounds=20, accountant=acc)
        got = composed_epsilon([(1.0, 0.5)] * 20, accountant=acc)
        assert got == pytest.approx(want, rel=1e-9)
    assert composed_epsilon([]) == 0.0
    assert composed_epsilon([(0.0, 1.0)]) == math.inf


def test_composed_epsilon_of_mixed_rounds_lies_between_the_uniform_ones() -> None:
    lo = epsilon(noise_multiplier=1.2, sampling_rate=1.0, rounds=10)
    hi = epsilon(noise_multiplier=0.8, sampling_rate=1.0, rounds=10)
    mixed = composed_epsilon([(1.2, 1.0)] * 5 + [(0.8, 1.0)] * 5)
    assert lo < mixed < hi
    # order does not matter, and adding a round never lowers epsilon
    assert composed_epsilon([(0.8, 1.0)] * 5 + [(1.2, 1.0)] * 5) == pytest.approx(mixed)
    assert composed_epsilon([(1.2, 1.0)] * 5 + [(0.8, 1.0)] * 6) > mixed


def test_distributed_noise_multiplier_shrinks_with_the_dropouts() -> None:
    assert distributed_noise_multiplier(1.0, planned=100, counted=100) == 1.0
    assert distributed_noise_multiplier(2.0, planned=100, counted=25) == pytest.approx(1.0)
    assert distributed_noise_multiplier(1.0, planned=10, counted=0) == 0.0
    for bad in ({"planned": 0, "counted": 0}, {"planned": 5, "counted": 6}, {"planned": 5, "counted": -1}):
        with pytest.raises(ValueError):
            distributed_noise_multiplier(1.0, **bad)
    with pytest.raises(ValueError):
        distributed_noise_multiplier(-1.0, planned=5, counted=5)


def test_composition_prices_one_more_round_without_recording_it() -> None:
    comp = Composition([(1.0, 0.5)] * 3 + [(0.8, 0.5)])
    assert comp.rounds == 4 and comp.epsilon() == pytest.approx(composed_epsilon([(1.0, 0.5)] * 3 + [(0.8, 0.5)]))
    before = comp.epsilon()
    priced = comp.epsilon_with(0.9, 0.5)
    assert priced > before and comp.epsilon() == before and comp.rounds == 4  # nothing recorded
    assert comp.epsilon_with(0.0, 0.5) == math.inf and comp.epsilon() == before
    comp.add(0.9, 0.5)
    assert comp.rounds == 5 and comp.epsilon() == pytest.approx(priced)
    assert comp.epsilon() == pytest.approx(composed_epsilon([(1.0, 0.5)] * 3 + [(0.8, 0.5), (0.9, 0.5)]))
    comp.add(0.0, 0.5)
    assert comp.epsilon() == math.inf
    assert Composition().epsilon() == 0.0
    with pytest.raises(ValueError):
        Composition([(1.0, 1.5)])
