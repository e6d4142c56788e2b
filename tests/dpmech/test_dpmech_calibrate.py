"""`dpmech.calibrate`: the scale and each share's sigma^2 from what an operator sets.

Oracles: `privacy_rho` (the shares must give the sum at least the noise
multiplier asked for, counting the sensitivity after rotation and rounding)
and `MechanismConfig`'s own refusals (the scale chosen is the largest valid
power of two)."""

from __future__ import annotations

import math

import pytest

from dpmech.calibrate import calibrate, noise_multiplier_of, with_shares
from dpmech.accounting import sensitivities
from dpmech.mechanism import MechanismConfig, local_sigma2, privacy_rho
from dpmech.quantize import norm_bound_sq


@pytest.mark.parametrize(("devices", "shares", "z", "bits"), [(100, 100, 1.0, 32), (100, 1, 1.0, 32), (20, 20, 0.5, 16),
                                                             (500, 250, 2.0, 32), (3, 3, 1.0, 12)])
def test_the_shares_carry_the_multiplier_asked_for_at_the_largest_scale_that_fits(devices: int, shares: int, z: float,
                                                                                bits: int) -> None:
    cfg = calibrate(dim=53_824, clip=0.1, noise_multiplier=z, devices=devices, shares=shares, bits=bits)
    assert cfg.padded_dim == 65_536 and cfg.devices == devices and cfg.bits == bits
    carried = noise_multiplier_of(privacy_rho(cfg, shares))
    assert z * (1 - 1e-9) <= carried <= z * 1.001  # never below; rounded up by little
    if cfg.scale * cfg.clip < 2 ** 16:  # below the largest scale tried: twice this scale is not valid
        double = 2 * cfg.scale * cfg.clip
        sensitivity = sensitivities(norm_bound_sq(double, cfg.padded_dim), cfg.padded_dim)[0]
        with pytest.raises(ValueError):
            MechanismConfig(dim=cfg.dim, clip=cfg.clip, scale=2 * cfg.scale, bits=bits, devices=devices,
                            sigma2=local_sigma2(z, sensitivity, shares))


def test_a_field_too_small_is_refused_naming_what_fits() -> None:
    with pytest.raises(ValueError, match=r"no scale fits .* need w >= 12 bits"):
        calibrate(dim=53_824, clip=0.1, noise_multiplier=1.0, devices=10, shares=10, bits=8)
    for clip, z, shares in ((1.0, 0.0, 10), (1.0, 1.0, 0), (1.0, 1.0, 11), (-1.0, 1.0, 10)):
        with pytest.raises(ValueError):
            calibrate(dim=100, clip=clip, noise_multiplier=z, devices=10, shares=shares, bits=32)


def test_with_shares_keeps_the_encoding_and_recalibrates_the_noise() -> None:
    cfg = calibrate(dim=1000, clip=1.0, noise_multiplier=1.0, devices=30, shares=10, bits=32)
    other = with_shares(cfg, 1.0, 20)
    assert (other.scale, other.bits, other.bound_sq, other.devices) == (cfg.scale, cfg.bits, cfg.bound_sq, cfg.devices)
    assert other.sigma2 < cfg.sigma2 and noise_multiplier_of(privacy_rho(other, 20)) >= 1.0 - 1e-9


def test_the_equivalent_multiplier() -> None:
    assert noise_multiplier_of(0.5) == pytest.approx(1.0) and noise_multiplier_of(2.0) == pytest.approx(0.5)
    assert noise_multiplier_of(0.0) == math.inf and noise_multiplier_of(math.inf) == 0.0
    with pytest.raises(ValueError):
        noise_multiplier_of(-1.0)
