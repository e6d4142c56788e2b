"""Removable noise around the discrete Gaussian (dpmech.removable_encoding):
the device's residues and the server's removal, checked against a sum
built here from the parts (rounded updates, component 0, kept components)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from dpmech import field as modular
from dpmech.exact_sampler import discrete_gaussian
from dpmech.mechanism import MechanismConfig, quantize
from dpmech.random_source import XofBytes
from dpmech.removable_encoding import RemovableNoise, encode, new_seeds, remove_surplus
from dpmech.removable_noise import component_noise, exact_component_variances

ROTATION = b"r" * 32


def _mechanism(devices: int, sigma2: Fraction = Fraction(40)) -> MechanismConfig:
    return MechanismConfig(dim=5, clip=1.0, scale=64.0, sigma2=sigma2, bits=24, devices=devices)


def _noise_source(i: int) -> XofBytes:
    return XofBytes(bytes([i]) * 32, b"test/component-0")


@pytest.mark.parametrize("dropped", [0, 1, 2, 3])
def test_the_sum_minus_the_surplus_is_the_counted_updates_plus_their_kept_noise(dropped: int) -> None:
    n, t = 7, 4
    mech = _mechanism(n)
    removable = RemovableNoise.for_group(mech, n, t)
    rng = np.random.default_rng(0)
    updates = rng.normal(size=(n, mech.dim))
    seeds = [new_seeds(removable, np.random.default_rng(100 + i).bytes) for i in range(n)]
    residues = [modular.to_unsigned(encode(updates[i], mech, ROTATION, np.random.default_rng(i), removable, seeds[i],
                                           noise=_noise_source(i)), mech.bits) for i in range(n)]
    counted = list(range(dropped, n))
    total = np.asarray(np.sum([residues[i] for i in counted], axis=0, dtype=np.uint64)
                       & np.uint64((1 << mech.bits) - 1), dtype=np.uint32)
    removed = {u: {k: seeds[u][k - 1] for k in removable.removed(len(counted))} for u in counted}
    removed = {u: ks for u, ks in removed.items() if ks}
    released = remove_surplus(total, len(counted), removed, removable, mech)

    # the oracle: each counted device's rounded update, its component 0, and its components 1..j, j = dropped
    want = np.zeros(mech.padded_dim, dtype=np.int64)
    for u in counted:
        want += quantize(updates[u], mech, ROTATION, np.random.default_rng(u))
        want += discrete_gaussian(mech.padded_dim, mech.sigma2, _noise_source(u))
        for k in range(1, dropped + 1):
            want += component_noise(seeds[u][k - 1], removable.variances[k], mech.padded_dim)
    np.testing.assert_array_equal(released, modular.to_unsigned(modular.wrap(want, mech.bits), mech.bits))


def test_component_zero_is_the_mechanisms_share_and_every_sum_keeps_at_least_the_target() -> None:
    n, t = 10, 6
    mech = _mechanism(n, Fraction(37, 3))
    removable = RemovableNoise.for_group(mech, n, t)
    assert removable.variances[0] == mech.sigma2 and removable.components == n - t
    exact = exact_component_variances(n, t, n * mech.sigma2)
    assert all(v >= e for v, e in zip(removable.variances, exact, strict=True))
    for s in range(t, n + 1):
        kept = [k for k in range(removable.components + 1) if k not in removable.removed(s)]
        assert kept == list(range(n - s + 1))
        assert s * sum(exact[k] for k in kept) == n * mech.sigma2  # exactly the target before any rounding up


def test_the_kept_noise_has_the_targets_variance() -> None:
    """Many coordinates, one group of 8 with t = 5 and 2 dropped: the
    released noise's sample variance is the target's (5 sigma from it
    fails)."""
    n, t, dropped, sigma2 = 8, 5, 2, Fraction(50)
    mech = MechanismConfig(dim=4096, clip=1.0, scale=1.0, sigma2=sigma2, bits=32, devices=n)
    removable = RemovableNoise.for_group(mech, n, t)
    zeros = np.zeros(mech.dim)
    seeds = [new_seeds(removable, np.random.default_rng(7 + i).bytes) for i in range(n)]
    counted = list(range(dropped, n))
    each = [modular.to_unsigned(encode(zeros, mech, ROTATION, np.random.default_rng(i), removable, seeds[i],
                                       noise=_noise_source(i)), 32) for i in counted]
    total = np.asarray(np.sum(each, axis=0, dtype=np.uint64) & np.uint64(0xFFFFFFFF), dtype=np.uint32)
    removed = {u: {k: seeds[u][k - 1] for k in removable.removed(len(counted))} for u in counted}
    released = modular.from_unsigned(remove_surplus(total, len(counted), removed, removable, mech).astype(np.uint64), 32)
    # zero updates round to zero: what is left is noise of variance n sigma^2 = 400
    target = float(n * sigma2)
    var = float(np.var(released.astype(np.float64)))
    assert abs(var - target) < 5 * target * np.sqrt(2 / released.size), (var, target)


def test_a_partial_removal_is_refused() -> None:
    n, t = 6, 4
    mech = _mechanism(n)
    removable = RemovableNoise.for_group(mech, n, t)
    seeds = {u: new_seeds(removable) for u in range(n)}
    total = np.zeros(mech.padded_dim, dtype=np.uint32)
    full = {u: {k: seeds[u][k - 1] for k in (1, 2)} for u in range(n)}
    remove_surplus(total, n, full, removable, mech)  # all six counted: components 1 and 2 of each
    with pytest.raises(ValueError, match="removal needs"):
        remove_surplus(total, n, {u: {2: seeds[u][1]} for u in range(n)}, removable, mech)
    with pytest.raises(ValueError, match="removal needs"):
        remove_surplus(total, n, {u: full[u] for u in range(5)}, removable, mech)
    with pytest.raises(ValueError, match="counted"):
        remove_surplus(total, t - 1, {}, removable, mech)
    remove_surplus(total, t, {}, removable, mech)  # t counted: nothing to remove


def test_encode_needs_one_seed_per_component() -> None:
    mech = _mechanism(6)
    removable = RemovableNoise.for_group(mech, 6, 4)
    with pytest.raises(ValueError, match="component seeds"):
        encode(np.zeros(mech.dim), mech, ROTATION, np.random.default_rng(0), removable, new_seeds(removable)[:1])
