"""FedMF: implicit mode (shares FedRAP's path) and explicit mode (MSE), contract and learning."""

from __future__ import annotations

import torch

from models.base import CohortData, LocalRound
from models.data.sampling import cohort_data, explicit_train_csr
from models.data.splits import random_explicit_split
from models.data.synthetic import synthetic
from models.sim.engine import SimulationConfig, simulate
from models.fedmf import FedMF, FedMFExplicit


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_implicit_fedmf_is_fedrap_without_personal_table() -> None:
    m = FedMF(10, 30, k=4)
    assert m.name == "fedmf" and m.kind == "implicit" and m.variant == "c_only"
    assert m.update_dim == 30 * 4
    data = CohortData(users=torch.arange(2), items=torch.tensor([[1, 2], [3, 0]]),
                      mask=torch.tensor([[True, True], [True, False]]), lengths=torch.tensor([2, 1]))  # fmt: skip
    p = m.init_private(data, m.init_global(gen()), 1)
    assert set(p) == {"u", "b"}


def test_explicit_contract_and_exact_step() -> None:
    items = torch.tensor([[0, 3, 4], [1, 3, 0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    ratings = torch.tensor([[5.0, 1.0, 3.0], [4.0, 2.0, 0.0]])
    data = CohortData(users=torch.arange(2), items=items, mask=mask, lengths=mask.sum(1), ratings=ratings)
    m = FedMFExplicit(
        2, 5, k=3, local_epochs=2, lr_user=0.2, lr_item=0.1, reg=0.05, item_bias=True, center=3.0, user_solver="gd"
    )
    assert m.kind == "explicit" and m.update_dim == 5 * 3 + 5
    g0 = m.init_global(gen())
    g0["bq"] = torch.randn(5, generator=gen(9)) * 0.1
    p0 = m.init_private(data, g0, 1)
    g_copy = {k: v.clone() for k, v in g0.items()}
    new_p, upd = m.local_update(LocalRound(g0, p0, data, 0, 2))
    assert all(torch.equal(g0[k], g_copy[k]) for k in g0)
    for b in range(2):
        p = p0["p"][b].clone().requires_grad_()
        Q = g0["Q"].clone().requires_grad_()
        bq = g0["bq"].clone().requires_grad_()
        it = items[b][mask[b]]
        r = ratings[b][mask[b]]
        n = len(it)
        for _ in range(2):
            pred = Q[it] @ p + bq[it] + 3.0
            loss = 0.5 * ((r - pred) ** 2).sum() + 0.05 / 2 * n * (p**2).sum() + 0.05 / 2 * (Q[it] ** 2).sum()
            gp, gQ, gb = torch.autograd.grad(loss, [p, Q, bq])
            with torch.no_grad():
                p -= 0.2 * gp / n
                Q -= 0.1 * gQ
                bq -= 0.1 * gb
        assert torch.allclose(new_p["p"][b], p, atol=1e-5)
        assert torch.allclose(upd[b, :15].view(5, 3), Q - g0["Q"], atol=1e-5)
        assert torch.allclose(upd[b, 15:], bq - g0["bq"], atol=1e-5)
    g1 = m.apply_mean_update(g0, upd.mean(0), 0)
    assert torch.allclose(g1["Q"], g0["Q"] + m.server_lr * upd.mean(0)[:15].view(5, 3))
    sc = m.score(g1, new_p, data.users, items)
    assert sc.shape == (2, 3)


def test_explicit_learns_better_than_the_center() -> None:
    x = synthetic(200, 300, seed=1)
    s = random_explicit_split(x, 0)
    base = float(((torch.from_numpy(s.val_rating) - 3.0) ** 2).mean().sqrt())
    res = simulate(SimulationConfig(model="fedmf", explicit=True, rounds=15, seed=0), interactions=x)
    assert res["best_val"]["rmse"] < base - 0.05
    data = cohort_data(s, range(s.n_users), explicit_csr=explicit_train_csr(s))
    assert data.ratings is not None


def test_implicit_learns_on_synthetic_data() -> None:
    x = synthetic(200, 300, seed=0)
    res = simulate(SimulationConfig(model="fedmf", rounds=6, seed=0), interactions=x)
    assert res["best_val"]["hr@10"] > 0.35


def test_exact_user_solver_zeroes_the_user_gradient() -> None:
    items = torch.tensor([[0, 3, 4, 2], [1, 3, 0, 0]])
    mask = torch.tensor([[True, True, True, True], [True, True, False, False]])
    ratings = torch.tensor([[5.0, 1.0, 3.0, 4.0], [4.0, 2.0, 0.0, 0.0]])
    data = CohortData(users=torch.arange(2), items=items, mask=mask, lengths=mask.sum(1), ratings=ratings)
    m = FedMFExplicit(2, 5, k=2, user_solver="exact", user_bias=True, reg=0.1, lr_item=0.0)
    g0 = m.init_global(gen())
    g0["bq"] = torch.randn(5, generator=gen(3)) * 0.2
    p0 = m.init_private(data, g0, 1)
    new_p, upd = m.local_update(LocalRound(g0, p0, data, 0, 2))
    assert torch.count_nonzero(upd) == 0  # lr_item = 0: only the users moved
    for b in range(2):
        p = new_p["p"][b].clone().requires_grad_()
        bu = new_p["bu"][b].clone().requires_grad_()
        it, r = items[b][mask[b]], ratings[b][mask[b]]
        pred = g0["Q"][it] @ p + g0["bq"][it] + bu + 3.0
        loss = 0.5 * ((r - pred) ** 2).sum() + 0.1 / 2 * len(it) * (p**2).sum()
        gp, gb = torch.autograd.grad(loss, [p, bu])
        assert gp.abs().max() < 1e-4 and gb.abs() < 1e-4
