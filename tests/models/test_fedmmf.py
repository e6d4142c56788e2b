"""FedMMF: private mask models (one / two / high order), the privacy indicator J, masked MF."""

from __future__ import annotations

import pytest
import torch

from models.base import LocalRound
from models.data.sampling import cohort_data, explicit_train_csr
from models.data.splits import random_explicit_split
from models.data.synthetic import synthetic
from models.sim.engine import SimulationConfig, simulate
from models.fedmmf import FedMMF


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def split():
    return random_explicit_split(synthetic(80, 200, seed=4), 0)


@pytest.fixture(scope="module")
def data(split):
    return cohort_data(split, range(split.n_users), explicit_csr=explicit_train_csr(split))


def feats(split) -> torch.Tensor:
    return torch.from_numpy(split.item_features)


def test_one_order_mask_is_the_ridge_solution(split, data) -> None:
    m = FedMMF(split.n_users, split.n_items, feats(split), order="one", mask_reg=0.1)
    mask, J = m.train_masks(data, 0)
    X = feats(split)
    for b in (0, 7, 31):
        it = data.items[b][data.mask[b]]
        r = data.ratings[b][data.mask[b]]
        A = torch.cat([torch.ones(len(it), 1), X[it]], 1).double()
        n = len(it)
        pen = torch.full((A.shape[1],), 0.1, dtype=torch.float64)
        pen[0] = 1e-6
        w = torch.linalg.solve(A.T @ A / n + torch.diag(pen), A.T @ r.double() / n)
        full = torch.cat([torch.ones(split.n_items, 1), X], 1).double() @ w
        assert torch.allclose(mask[b].double(), full, atol=1e-3)
        assert J[b].item() == pytest.approx(float(((r.double() - full[it]) ** 2).mean()), rel=1e-3)


@pytest.mark.parametrize("order", ["one", "two", "high"])
def test_masks_fit_better_than_the_user_mean(split, data, order: str) -> None:
    m = FedMMF(split.n_users, split.n_items, feats(split), order=order, mask_reg=1e-3, mask_steps=150)
    mask, J = m.train_masks(data, 1)
    assert mask.shape == (split.n_users, split.n_items) and J.shape == (split.n_users,)
    r = data.ratings * data.mask
    n = data.mask.sum(1)
    mean = r.sum(1) / n
    var = (((r - mean[:, None]) * data.mask) ** 2).sum(1) / n
    assert (J <= var + 1e-4).float().mean() > 0.9
    assert J.mean() < var.mean()


def test_private_state_prediction_and_summary(split, data) -> None:
    m = FedMMF(split.n_users, split.n_items, feats(split), order="two", mask_steps=30, k=4)
    g0 = m.init_global(gen())
    p0 = m.init_private(data, g0, 1)
    assert set(p0) == {"p", "mask", "J"}
    items = torch.arange(6).repeat(split.n_users, 1)
    got = m.score(g0, p0, data.users, items)
    q = g0["Q"][items]
    want = torch.einsum("bkd,bd->bk", q, p0["p"]) + g0["bq"][items] + p0["mask"][:, :6]
    assert torch.allclose(got, want, atol=1e-5)
    rows = torch.tensor([2, 3])
    part = {k: v.index_select(0, rows) for k, v in p0.items()}
    new_p, upd = m.local_update(LocalRound(g0, part, cohort_data(split, rows), 0, 2))
    assert upd.shape == (2, m.update_dim)
    assert torch.equal(new_p["mask"], part["mask"]) and torch.equal(new_p["J"], part["J"])
    s = m.summary(g0, p0)
    assert s["privacy_J_min"] <= s["privacy_J_median"] <= s["privacy_J_max"]
    assert s["privacy_J_mean"] == pytest.approx(float(p0["J"].double().mean()))


def test_masked_mf_trains_on_the_residual(split, data) -> None:
    """With the mask absorbing the ratings exactly, the MF part sees zero targets."""
    m = FedMMF(split.n_users, split.n_items, feats(split), order="one", k=3, reg=0.0, item_bias=False)
    g0 = m.init_global(gen())
    g0["Q"].zero_()
    p0 = m.init_private(data, g0, 1)
    table = torch.zeros(split.n_users, split.n_items)
    table[torch.arange(split.n_users)[:, None].expand_as(data.items)[data.mask], data.items[data.mask]] = data.ratings[
        data.mask
    ]
    p0["mask"] = table
    _, upd = m.local_update(LocalRound(g0, p0, data, 0, 2))
    assert torch.count_nonzero(upd) == 0


def test_bad_order_raises(split) -> None:
    with pytest.raises(ValueError):
        FedMMF(3, 4, None, order="third")


def test_fedmmf_learns(split) -> None:
    x = synthetic(200, 300, seed=1)
    s = random_explicit_split(x, 0)
    base = float(((torch.from_numpy(s.val_rating) - 3.0) ** 2).mean().sqrt())
    res = simulate(SimulationConfig(model="fedmmf", rounds=10, seed=0, params={"mask_steps": 100}), interactions=x)
    assert res["best_val"]["rmse"] < base - 0.05
    assert res["summary"]["privacy_J_mean"] > 0
