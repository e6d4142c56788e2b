"""FREIB's Laplace local DP sampled exactly (models/laplace_ldp.py, D88).

Oracles: the discrete Laplace's probability mass function (chi-square), the
grid every release lies on, and the L1 bound that makes 2C / lambda an
upper bound on epsilon for the mechanism that runs."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from models.laplace_ldp import _round_within_l1, grid_steps, laplace_noise, privatize_laplace

ROOT = Path(__file__).resolve().parents[2]


def test_the_noise_follows_the_discrete_laplace_pmf() -> None:
    t, n = 4, 200_000
    y = laplace_noise((n,), scale=1.0, generator=torch.Generator().manual_seed(3), steps=t).double().numpy() * t
    assert np.array_equal(y, np.round(y))  # on the grid
    values = np.arange(-20, 21)
    pmf = np.exp(-np.abs(values) / t)
    pmf /= np.exp(-np.abs(np.arange(-400, 401)) / t).sum()
    observed = np.array([(y == v).sum() for v in values] + [(np.abs(y) > 20).sum()])
    expected = np.append(pmf * n, n * (1 - pmf.sum()))
    assert stats.chisquare(observed, expected).pvalue > 1e-6


def test_a_release_is_on_the_grid_and_within_the_l1_bound() -> None:
    rows = torch.randn(3, 500, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 5
    clip, scale = 2.0, 0.1
    t = grid_steps(clip=clip, scale=scale, dim=500)
    assert math.sqrt(500) * scale / t <= clip / 1000 and t & (t - 1) == 0
    out, norms = privatize_laplace(rows, clip=clip, scale=scale, generator=torch.Generator().manual_seed(2))
    units = out.numpy() * t / scale
    assert np.allclose(units, np.round(units), atol=1e-6) and torch.allclose(norms, rows.abs().sum(1))
    assert 2 * math.floor(clip * t / scale) / t <= 2 * clip / scale  # epsilon_per_release bounds the release
    z = np.full((2, 400), 3.7) * np.array([[1.0], [-1.0]])  # L1 1480: bound 1500 leaves 20 = sqrt(400)
    r = _round_within_l1(z, 1500, np.random.default_rng(0))
    assert (np.abs(r).sum(axis=1) <= 1500).all() and set(np.unique(np.abs(r))) <= {3, 4}


def test_no_float_sampler_is_left() -> None:
    tree = ast.parse((ROOT / "models" / "laplace_ldp.py").read_text())
    calls = {f"{n.func.value.id}.{n.func.attr}" for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)}
    assert not calls & {"torch.rand", "torch.log1p", "torch.log", "np.log"}
