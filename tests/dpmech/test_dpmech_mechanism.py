"""The mechanism end to end: devices encode, a secure sum adds their words
mod 2^w, the server decodes the sum of the clipped updates plus the counted
devices' noise; configurations that cannot work are refused.

Oracles: the plain float sum of the clipped updates (the decoded sum must
be within the rounding and noise the mechanism adds), and the noise law
(its variance per coordinate, n sigma^2 / s^2 in model units)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from dpmech import accounting
from dpmech.field import to_unsigned
from dpmech.mechanism import (MechanismConfig, decode_sum, encode, local_sigma2, privacy_rho, quantize,
                              simulated_sum)
from dpmech.random_source import GeneratorBytes
from dpmech.rotation import unrotate


def _config(dim: int = 3000, devices: int = 6, z: float = 0.5, bits: int = 32) -> MechanismConfig:
    probe = MechanismConfig(dim=dim, clip=1.0, scale=2.0 ** 10, sigma2=Fraction(1), bits=bits, devices=devices)
    return MechanismConfig(dim=dim, clip=1.0, scale=2.0 ** 10, bits=bits, devices=devices,
                           sigma2=local_sigma2(z, probe.sensitivity, devices))


def _secure_sum(vectors: list[np.ndarray], bits: int) -> np.ndarray:
    """What secure aggregation returns: the residues' sum in uint32 words."""
    total = np.zeros(vectors[0].size, dtype=np.uint32)
    for v in vectors:
        total += to_unsigned(v, bits).astype(np.uint32)
    return total


def test_the_decoded_sum_is_the_clipped_sum_plus_the_counted_noise() -> None:
    cfg = _config()
    rng = np.random.default_rng(0)
    updates = rng.normal(size=(cfg.devices, cfg.dim)) * np.array([[0.01], [0.1], [1.0], [5.0], [0.02], [0.3]])
    clipped = updates * np.minimum(1.0, 1.0 / np.linalg.norm(updates, axis=1, keepdims=True))
    source = GeneratorBytes(np.random.default_rng(1))
    words = [encode(u, cfg, b"round 1", rng, noise=source) for u in updates]
    assert all(w.min() >= -2 ** 31 and w.max() < 2 ** 31 for w in words)
    error = decode_sum(_secure_sum(words, cfg.bits), cfg, b"round 1") - clipped.sum(axis=0)
    # Noise of 6 shares, N_Z(0, sigma^2) each, rotated back: per-coordinate
    # variance 6 sigma^2 / s^2 (plus the rounding's, at most 6 / (4 s^2)).
    noise_var = cfg.devices * float(cfg.sigma2) / cfg.scale ** 2
    rounding_var = cfg.devices / (4 * cfg.scale ** 2)
    assert abs(error.mean()) < 5 * math.sqrt((noise_var + rounding_var) / cfg.dim)
    assert noise_var * 0.9 < error.var() < (noise_var + rounding_var) * 1.1


def test_a_dropped_device_is_not_in_the_sum() -> None:
    cfg = _config()
    rng = np.random.default_rng(2)
    updates = rng.normal(size=(cfg.devices, cfg.dim)) * 0.01
    words = [encode(u, cfg, b"r", rng) for u in updates]
    counted = [0, 2, 3, 5]
    estimate = decode_sum(_secure_sum([words[i] for i in counted], cfg.bits), cfg, b"r")
    noise_sd = math.sqrt(len(counted) * float(cfg.sigma2)) / cfg.scale
    error = estimate - updates[counted].sum(axis=0)
    assert error.std() < 1.2 * noise_sd
    assert privacy_rho(cfg, len(counted)) > privacy_rho(cfg, cfg.devices)  # less noise reached the sum


def test_without_noise_the_sum_decodes_to_within_the_rounding() -> None:
    """The decode undoes wrap, rotation and scale exactly: the only error
    left is each device's rounding, under 1 per coordinate before rotating
    back (so at most n sqrt(d') / s in L2)."""
    cfg = _config(devices=4)
    rng = np.random.default_rng(3)
    updates = rng.normal(size=(4, cfg.dim))
    clipped = updates / np.linalg.norm(updates, axis=1, keepdims=True)
    rounded = quantize(updates, cfg, b"seed", rng)
    assert rounded.shape == (4, cfg.padded_dim)
    assert all(int(r @ r) <= cfg.bound_sq for r in rounded)
    decoded = decode_sum(rounded.sum(axis=0), cfg, b"seed")
    assert np.linalg.norm(decoded - clipped.sum(axis=0)) < 4 * math.sqrt(cfg.padded_dim) / cfg.scale
    np.testing.assert_allclose(decoded, unrotate(rounded.sum(axis=0), b"seed", cfg.dim) / cfg.scale)


def test_the_simulators_sum_has_the_devices_law() -> None:
    """simulated_sum (seeded shares) and encode (CSPRNG shares) put noise of
    the same variance in the decoded sum."""
    cfg = _config(devices=5)
    rng = np.random.default_rng(4)
    updates = rng.normal(size=(5, cfg.dim)) * 0.01
    rounded = quantize(updates, cfg, b"x", rng)
    simulated = decode_sum(simulated_sum(rounded, cfg, rng), cfg, b"x")
    real = decode_sum(_secure_sum([encode(u, cfg, b"x", rng) for u in updates], cfg.bits), cfg, b"x")
    plain = decode_sum(rounded.sum(axis=0), cfg, b"x")
    expected = 5 * float(cfg.sigma2) / cfg.scale ** 2
    for noisy in (simulated, real):
        assert 0.85 < (noisy - plain).var() / expected < 1.15  # 4096 coordinates: +-2.2% sd


def test_noise_wraps_on_devices_and_the_sum_still_decodes() -> None:
    """With w small enough that single noisy coordinates wrap on a device
    (but the sum's bound is still met) the decoded sum is unaffected."""
    cfg = MechanismConfig(dim=64, clip=1.0, scale=16.0, sigma2=Fraction(900), bits=12, devices=2,
                          overflow_target=0.5)
    rng = np.random.default_rng(5)
    updates = rng.normal(size=(2, 64)) * 0.01
    rounded = quantize(updates, cfg, b"w", rng)
    noise = [np.asarray(np.round(rng.normal(0, 30, size=64)), dtype=np.int64) * 40 for _ in range(2)]
    noise[1] = -noise[0]  # large, opposite: each device's value wraps, the sum cancels it
    words = [((r + n + 2048) % 4096) - 2048 for r, n in zip(rounded, noise)]
    assert any(np.any(np.abs(r + n) >= 2048) for r, n in zip(rounded, noise))
    decoded = decode_sum(_secure_sum(words, 12), cfg, b"w")
    np.testing.assert_allclose(decoded, decode_sum(rounded.sum(axis=0), cfg, b"w"))


def test_invalid_configurations_are_refused() -> None:
    with pytest.raises(ValueError, match="too small for 1000 devices"):
        MechanismConfig(dim=53_824, clip=1.0, scale=2.0 ** 12, sigma2=Fraction(10 ** 6), bits=16, devices=1000)
    with pytest.raises(ValueError, match="sigma >= 1/2"):
        MechanismConfig(dim=10, clip=1.0, scale=4.0, sigma2=Fraction(1, 5), bits=32, devices=2)
    with pytest.raises(ValueError, match="too large"):
        MechanismConfig(dim=10, clip=1.0, scale=4.0, sigma2=Fraction(2 ** 40), bits=62, devices=2)
    with pytest.raises(ValueError, match="dim"):
        MechanismConfig(dim=0, clip=1.0, scale=4.0, sigma2=Fraction(4), bits=32, devices=2)
    cfg = _config()
    with pytest.raises(ValueError, match="coordinates"):
        encode(np.zeros(cfg.dim + 1), cfg, b"s", np.random.default_rng(0))


def test_local_sigma2_rounds_up_and_meets_the_noise_multiplier() -> None:
    for z, sens, n in ((1.0, 4098.5, 10), (0.7, 300.0, 1000), (2.0, 17.3, 3)):
        s2 = local_sigma2(z, sens, n)
        assert isinstance(s2, Fraction) and float(s2) * n >= (z * sens) ** 2
        assert float(s2) * n < (z * sens) ** 2 * 1.01 + n
    cfg = _config(z=1.0, devices=10)
    # The whole cohort's sum at noise multiplier 1: rho ~ 1/2 (tau negligible at this sigma).
    assert privacy_rho(cfg, 10) == pytest.approx(0.5, rel=1e-3)
    assert accounting.epsilon([privacy_rho(cfg, 10)] * 10, 1e-5) > accounting.epsilon([privacy_rho(cfg, 10)], 1e-5)
