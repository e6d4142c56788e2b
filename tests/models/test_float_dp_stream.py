"""The float Gaussian fed in pieces (models/sim/float_dp_stream.py, D106).

Against an independent oracle: every row clipped to tau on its own and
noised with N(0, (z_g tau)^2) from one generator, rows taken group after
group, the noisy rows summed in float64 in that order. The stream fed in any
cuts (each piece's rows shuffled within its slice) gives that sum, the
norms and the ledger entry bit for bit, and so does `privatize_in_groups`
over the whole table; pieces out of order are refused before anything is drawn.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models.sim.config import DPSettings
from models.sim.dp_groups import privatize_in_groups
from models.sim.float_dp_stream import FloatGaussianSum

DP = DPSettings(noise=0.8, clip=0.5, delta=1e-5, accountant="rdp", mode="distributed", mechanism="gaussian-float")


def _groups(n: int, k: int) -> tuple[tuple[int, ...], ...]:
    """k groups of a shuffled 0..n-1 (so that group order is not row order)."""
    perm = np.random.default_rng(n * 31 + k).permutation(n).tolist()
    return tuple(tuple(sorted(perm[j::k])) for j in range(k))


def _oracle(x: torch.Tensor, groups: tuple[tuple[int, ...], ...], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    total = None
    norms = torch.empty(x.shape[0], dtype=torch.float64)
    for grp in groups:
        z = DP.noise / math.sqrt(len(grp))
        for p in grp:
            row = x[p]
            norm = torch.linalg.vector_norm(row.unsqueeze(0), dim=1)
            clipped = row * torch.clamp(DP.clip / norm.clamp(min=1e-12), max=1.0)
            noisy = clipped + torch.randn((1, x.shape[1]), generator=g, dtype=x.dtype).mul_(z * DP.clip)[0]
            total = noisy.to(torch.float64) if total is None else total + noisy
            norms[p] = float(norm)
    assert total is not None
    return total, norms


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 20), k=st.integers(1, 4), dim=st.integers(1, 40), seed=st.integers(0, 2**31),
       data=st.data())
def test_any_cuts_give_the_oracles_sum(n: int, k: int, dim: int, seed: int, data: st.DataObject) -> None:
    k = min(k, n)
    groups = _groups(n, k)
    x = torch.from_numpy(np.random.default_rng(seed).normal(0, 0.4, (n, dim)).astype(np.float32))
    stream = FloatGaussianSum(n, dim, dp=DP, groups=groups, generator=torch.Generator().manual_seed(seed),
                              secure=None)  # fmt: skip
    order = stream.order()
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=4)))
    for a, b in zip([0, *cuts], [*cuts, n], strict=True):
        pos = np.array(data.draw(st.permutations(order[a:b].tolist())), dtype=np.int64)
        stream.add(x[torch.as_tensor(pos)], pos)
    total, norms, entry, secured = stream.finish()
    want, want_norms = _oracle(x, groups, seed)
    assert torch.equal(total, want) and torch.equal(norms, want_norms) and secured == {}
    assert [grp["size"] for grp in entry["groups"]] == [len(g) for g in groups]
    assert entry["noise_multiplier"] == pytest.approx(DP.noise)  # each group's sum carries z
    # the whole table at once draws the same noise for every device
    noisy, t_norms, t_entry = privatize_in_groups(x, dp=DP, groups=groups,
                                                  generator=torch.Generator().manual_seed(seed))  # fmt: skip
    order_t = torch.as_tensor(order)
    summed = None
    for row in noisy[order_t]:
        summed = row.to(torch.float64) if summed is None else summed + row
    assert summed is not None and torch.equal(summed, want) and torch.equal(t_norms.double(), want_norms)
    assert t_entry["groups"] == entry["groups"]


def test_pieces_out_of_order_are_refused_before_any_draw() -> None:
    groups = ((0, 2), (1, 3))
    gen = torch.Generator().manual_seed(0)
    stream = FloatGaussianSum(4, 3, dp=DP, groups=groups, generator=gen, secure=None)
    state = gen.get_state()
    with pytest.raises(ValueError, match="round's order"):
        stream.add(torch.zeros(2, 3), np.array([0, 1]))  # the first slice is 0 and 2
    with pytest.raises(ValueError, match="length 3"):
        stream.add(torch.zeros(1, 4), np.array([0]))
    assert torch.equal(gen.get_state(), state) and stream.done == 0
    stream.add(torch.zeros(2, 3), np.array([2, 0]))
    with pytest.raises(ValueError, match="4 devices, 2 were added"):
        stream.finish()
    with pytest.raises(ValueError, match="more than the round's 4"):
        stream.add(torch.zeros(3, 3))
    with pytest.raises(ValueError, match="exactly once"):
        FloatGaussianSum(3, 3, dp=DP, groups=((0, 1),), generator=gen, secure=None)
