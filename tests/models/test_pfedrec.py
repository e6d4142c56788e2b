"""PFedRec: contract, the two-step mini-batch update against autograd, learning."""

from __future__ import annotations

import pytest
import torch

import models.pfedrec as pf_mod
from models.base import CohortData, LocalRound
from models.data.sampling import cohort_data
from models.data.splits import leave_one_out
from models.data.synthetic import synthetic
from models.sim.engine import SimulationConfig, simulate
from models.keyed_random import KeyedStream, Purpose
from models.pfedrec import PFedRec


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    s = leave_one_out(synthetic(100, 240, seed=2), seed=0)
    m = PFedRec(s.n_users, s.n_items, k=8)
    g0 = m.init_global(gen())
    data = cohort_data(s, list(range(s.n_users)))
    p0 = m.init_private(data, g0, 1)
    assert m.update_dim == s.n_items * 8
    assert p0["E"].shape == (s.n_users, s.n_items, 8) and torch.equal(p0["E"][3], g0["E"])
    rows = torch.tensor([1, 4, 9])
    sub = cohort_data(s, rows)
    part = {k: v.index_select(0, rows) for k, v in p0.items()}
    g_copy = {k: v.clone() for k, v in g0.items()}
    part_copy = {k: v.clone() for k, v in part.items()}
    new_p, upd = m.local_update(LocalRound(g0, part, sub, 0, 2))
    assert upd.shape == (3, m.update_dim)
    assert all(torch.equal(g0[k], g_copy[k]) for k in g0)
    assert all(torch.equal(part[k], part_copy[k]) for k in part)
    # the personalised embedding is the global one plus the uploaded change
    assert torch.allclose(new_p["E"], g0["E"] + upd.view(3, s.n_items, 8), atol=1e-6)
    # the score function never leaves the device: the update is E_i - E only
    g1 = m.apply_mean_update(g0, upd.mean(0), 0)
    assert torch.allclose(g1["E"], g0["E"] + m.server_lr * upd.mean(0).view(s.n_items, 8), atol=1e-5)
    sc = m.score(g1, new_p, sub.users, torch.arange(10).repeat(3, 1))
    assert sc.shape == (3, 10)


def test_two_step_minibatch_update_equals_autograd(monkeypatch: pytest.MonkeyPatch) -> None:
    """One device, known samples and batches: step the score function on the mean
    batch BCE, then the item embedding on the summed batch BCE with the new S_i."""
    items = torch.tensor([[0, 2, 5]])
    data = CohortData(users=torch.tensor([0]), items=items, mask=torch.ones(1, 3, dtype=torch.bool),
                      lengths=torch.tensor([3]))  # fmt: skip
    negs = (torch.tensor([0, 0, 0]), torch.tensor([1, 3, 3]))
    monkeypatch.setattr(pf_mod, "negative_samples", lambda *a, **kw: negs)
    m = PFedRec(1, 6, k=3, batch_size=4, n_neg=1, lr=0.3, lr_item=0.7, weight_decay=0.0)
    g0 = m.init_global(gen(3))
    p0 = m.init_private(data, g0, 4)
    new_p, upd = m.local_update(LocalRound(g0, p0, data, 0, 5))
    # replay the shuffling the model did: sample i of user 0 (positives 0..2, then the
    # negatives of positions 0..2) has the keyed sort key of (seed 5, SHUFFLE, round 0, epoch 0, user 0, i)
    dev = torch.zeros(6, dtype=torch.long)
    key = KeyedStream.of(5, Purpose.SHUFFLE, 0, 0).uniform(torch.tensor(0), torch.arange(6))
    order = torch.argsort(key)
    rank = torch.empty(6, dtype=torch.long)
    rank[order] = torch.arange(6)
    bid = rank // 4
    all_items = torch.tensor([0, 2, 5, 1, 3, 3])
    y = torch.tensor([1.0, 1, 1, 0, 0, 0])
    w = p0["w"][0].clone()
    b = p0["b"][0].clone()
    E = g0["E"].clone()
    for t in range(2):
        sel = bid == t
        it, yy = all_items[sel], y[sel]
        wv = w.clone().requires_grad_()
        bv = b.clone().requires_grad_()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(E[it] @ wv + bv, yy)
        gw, gb = torch.autograd.grad(loss, [wv, bv])
        w, b = w - 0.3 * gw, b - 0.3 * gb
        Ev = E.clone().requires_grad_()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(Ev[it] @ w + b, yy, reduction="sum")
        (gE,) = torch.autograd.grad(loss, [Ev])
        E = E - 0.7 * gE
    assert dev.sum() == 0
    assert torch.allclose(new_p["w"][0], w, atol=1e-5)
    assert torch.allclose(new_p["b"][0], b, atol=1e-5)
    assert torch.allclose(new_p["E"][0], E, atol=1e-5)
    assert torch.allclose(upd[0].view(6, 3), E - g0["E"], atol=1e-5)


def test_learns_on_synthetic_data() -> None:
    x = synthetic(200, 300, seed=0)
    res = simulate(SimulationConfig(model="pfedrec", rounds=12, seed=0), interactions=x)
    assert res["best_val"]["hr@10"] > 0.35
    assert 0.03 < res["placebo"]["hr@10"] < 0.2
