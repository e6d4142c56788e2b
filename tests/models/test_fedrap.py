"""FedRAP: interface contract, exact gradients, curriculum, proximal sparsity, variants, learning."""

from __future__ import annotations

import math

import pytest
import torch

import models.fedrap as fedrap_mod
from models.base import CohortData, LocalRound
from models.data.sampling import cohort_data
from models.data.splits import leave_one_out
from models.data.synthetic import synthetic
from models.sim.engine import SimulationConfig, simulate
from models.fedrap import CURRICULA, FedRAP, curriculum_weight


def tiny_cohort() -> CohortData:
    items = torch.tensor([[0, 1, 2, 0], [3, 4, 0, 0], [5, 6, 1, 2]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    return CohortData(users=torch.arange(3), items=items, mask=mask, lengths=mask.sum(1))


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def synth_split():
    return leave_one_out(synthetic(150, 260, seed=3), seed=0)


# ------------------------------------------------------------------ contract


@pytest.mark.parametrize("variant", ["full", "c_only", "d_only"])
def test_contract_shapes_and_no_mutation(synth_split, variant: str) -> None:
    s = synth_split
    m = FedRAP(s.n_users, s.n_items, k=8, variant=variant, local_epochs=2, v1=1e-3, v2=1e-3)
    data = cohort_data(s, list(range(s.n_users)))
    g0 = m.init_global(gen())
    p0 = m.init_private(data, g0, 1)
    assert m.update_dim == (0 if variant == "d_only" else s.n_items * 8)
    if variant != "c_only":
        assert p0["D"].shape == (s.n_users, s.n_items, 8)
    g_copy = {k: v.clone() for k, v in g0.items()}
    p_copy = {k: v.clone() for k, v in p0.items()}
    rows = torch.tensor([0, 5, 7, 20])
    sub = cohort_data(s, rows)
    part = {k: v.index_select(0, rows) for k, v in p0.items()}
    part_copy = {k: v.clone() for k, v in part.items()}
    new_p, upd = m.local_update(LocalRound(g0, part, sub, round_idx=3, seed=2))
    assert upd.shape == (4, m.update_dim) and upd.dtype == torch.float32
    assert set(new_p) == set(p0) and all(new_p[k].shape == part[k].shape for k in new_p)
    for k in g0:  # global state untouched
        assert torch.equal(g0[k], g_copy[k])
    for k in part:  # and the private rows passed in too
        assert torch.equal(part[k], part_copy[k])
    g1 = m.apply_mean_update(g0, upd.mean(0), 3)
    assert set(g1) == set(g0) and all(torch.equal(g0[k], g_copy[k]) for k in g0)
    sc = m.score(g1, new_p, sub.users, torch.randint(0, s.n_items, (4, 11), generator=gen(3)))
    assert sc.shape == (4, 11) and torch.isfinite(sc).all()
    assert all(torch.equal(p0[k], p_copy[k]) for k in p0)


def test_update_is_only_the_change_of_c(synth_split) -> None:
    """The update is C_i - C: it has the global shape, and a device that sees no
    data (and no regulariser) sends zeros whatever its private D_i and u_i are."""
    s = synth_split
    m = FedRAP(s.n_users, s.n_items, k=4, local_epochs=1, v1=0.0, item_bias=False)
    g0 = m.init_global(gen())
    empty = CohortData(
        users=torch.tensor([0, 1]),
        items=torch.zeros(2, 1, dtype=torch.long),
        mask=torch.zeros(2, 1, dtype=torch.bool),
        lengths=torch.zeros(2, dtype=torch.long),
    )
    priv = m.init_private(empty, g0, 1)
    priv["D"].normal_(generator=gen(5))
    _, upd = m.local_update(LocalRound(g0, priv, empty, 0, 2))
    assert upd.shape == (2, g0["C"].numel())
    assert torch.count_nonzero(upd) == 0


@pytest.mark.parametrize("variant", ["full", "c_only", "d_only"])
@pytest.mark.parametrize("item_bias", [False, True])
def test_inner_chunks_and_worker_threads_change_nothing(
    synth_split, variant: str, item_bias: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device's result does not depend on which inner chunk trains it, with
    which others its negatives are drawn, or how many worker threads train the
    chunks: chunks of 3, drawn one chunk at a time, on 2 threads give what one
    chunk of the whole cohort on one thread gives (up to float summation order)."""
    monkeypatch.setattr(fedrap_mod, "_CHUNKS_PER_DRAW", 1)
    s = synth_split
    rows = torch.arange(0, s.n_users, 7)
    sub = cohort_data(s, rows)
    outs = []
    threads = torch.get_num_threads()
    try:
        for chunk, n_threads in ((len(rows), 1), (3, 2)):
            torch.set_num_threads(n_threads)
            m = FedRAP(s.n_users, s.n_items, k=8, variant=variant, local_epochs=3, v1=1e-3, v2=1e-3,
                       item_bias=item_bias, weight_decay_d=0.1, update_scale=3.0, chunk=chunk)  # fmt: skip
            g0 = m.init_global(gen())
            p0 = m.init_private(sub, g0, 1)
            outs.append(m.local_update(LocalRound(g0, p0, sub, round_idx=4, seed=2)))
            assert torch.get_num_threads() == n_threads  # the workers' single-threading does not leak
    finally:
        torch.set_num_threads(threads)
    (p_one, u_one), (p_many, u_many) = outs
    assert u_one.shape == u_many.shape
    assert torch.allclose(u_one, u_many, atol=1e-6, rtol=0)
    for key in p_one:
        assert torch.allclose(p_one[key], p_many[key], atol=1e-6, rtol=0), key
    if variant != "d_only":
        assert u_one.abs().max() > 1e-4  # the devices really trained


# ------------------------------------------------------------------ exact gradients


@pytest.mark.parametrize("recency", [0.0, 2.0])
def test_dense_formulation_equals_autograd(monkeypatch: pytest.MonkeyPatch, recency: float) -> None:
    """The count-table full-batch step equals autograd on Eq. (3) sample by sample
    (with `recency`: each positive's BCE term weighted by its recency weight, written out here)."""
    data = tiny_cohort()
    B, m_items, k, E = 3, 7, 4, 2
    pos = torch.zeros(B, m_items)
    for b in range(B):
        hist = data.items[b][data.mask[b]].tolist()  # in time order, oldest first
        L = len(hist)
        raw = [math.exp(-recency * (L - 1 - j) / L) for j in range(L)]
        for j, item in enumerate(hist):
            pos[b, item] = raw[j] * L / sum(raw)  # mean 1 over the device's positives
    if recency > 0:  # the weights really differ: the newest item weighs more than the oldest
        assert pos[0, 2] > pos[0, 0] and abs(float(pos[2].sum()) - 4.0) < 1e-5
    negc = torch.randint(0, 3, (E, B, m_items), generator=gen(7)).to(torch.uint8)
    negc[:, pos.bool()] = 0
    monkeypatch.setattr(fedrap_mod, "negative_counts", lambda *a, **kw: negc)
    model = FedRAP(
        B, m_items, k=k, local_epochs=E, n_neg=1, lr_user=0.3, lr_item=0.2, lr_personal=0.15, v1=0.05,
        v2=0.0, init_std_d=0.1, weight_decay_d=0.01, weight_decay_u=0.02, lr_decay=1.0, item_bias=False,
        recency=recency,
    )  # fmt: skip
    G = model.init_global(gen(1))
    P = model.init_private(data, G, 1)
    a = 5
    new_p, upd = model.local_update(LocalRound(G, P, data, a, 2))
    lam = model.lam(a)
    for b in range(B):
        u = P["u"][b].clone().requires_grad_()
        bb = P["b"][b].clone().requires_grad_()
        D = P["D"][b].clone().requires_grad_()
        C = G["C"].clone().requires_grad_()
        n = int(data.lengths[b]) * 2
        for e in range(E):
            z = (D + C) @ u + bb
            w = negc[e, b].float()
            bce = (w * torch.nn.functional.softplus(z) + pos[b] * torch.nn.functional.softplus(-z)).sum()
            loss_u = bce / n + 0.02 / 2 * (u**2).sum()
            gu, gb = torch.autograd.grad(loss_u, [u, bb], retain_graph=True)
            gD, gC = torch.autograd.grad(bce, [D, C])
            with torch.no_grad():
                u -= 0.3 * gu
                bb -= 0.3 * gb
                D -= 0.15 * gD
                C -= 0.2 * gC
        with torch.no_grad():  # the split step on -lambda ||D - C||^2 (+ weight decay on D)
            t_d, t_c = E * 0.15, E * 0.2
            delta = D - C
            D.div_(1 + t_d * 0.01)
            D += 2 * lam * t_d * delta
            C -= 2 * lam * t_c * delta
        assert torch.allclose(new_p["u"][b], u, atol=1e-5)
        assert torch.allclose(new_p["b"][b], bb, atol=1e-5)
        assert torch.allclose(new_p["D"][b], D, atol=1e-5)
        assert torch.allclose(upd[b].view(m_items, k), C - G["C"], atol=1e-5)


def test_item_bias_step_equals_autograd(monkeypatch: pytest.MonkeyPatch) -> None:
    """With item_bias the score gains a shared c_j, stepped like C's rows (summed BCE,
    lr_bias) on the device's copy; the update is [C_i - C, c_i - c] and the server
    adds server_lr times the mean of both parts, with no regulariser on c."""
    data = tiny_cohort()
    B, m_items, k, E = 3, 7, 4, 2
    pos = torch.zeros(B, m_items)
    for b in range(B):
        pos[b, data.items[b][data.mask[b]]] = 1
    negc = torch.randint(0, 3, (E, B, m_items), generator=gen(8)).to(torch.uint8)
    negc[:, pos.bool()] = 0
    monkeypatch.setattr(fedrap_mod, "negative_counts", lambda *a, **kw: negc)
    model = FedRAP(
        B, m_items, k=k, local_epochs=E, n_neg=1, lr_user=0.3, lr_item=0.2, lr_personal=0.15, v1=0.0,
        v2=0.0, init_std_d=0.1, weight_decay_u=0.0, lr_decay=1.0, item_bias=True, lr_bias=0.07, server_lr=2.0,
        recency=0.0,  # every positive weighs 1 in the reference below (recency has its own autograd test)
    )  # fmt: skip
    assert model.update_dim == m_items * k + m_items
    G = model.init_global(gen(1))
    G["c_bias"] = torch.randn(m_items, generator=gen(4)) * 0.1
    P = model.init_private(data, G, 1)
    new_p, upd = model.local_update(LocalRound(G, P, data, 3, 2))
    assert upd.shape == (B, m_items * k + m_items)
    for b in range(B):
        u = P["u"][b].clone().requires_grad_()
        bb = P["b"][b].clone().requires_grad_()
        D = P["D"][b].clone().requires_grad_()
        C = G["C"].clone().requires_grad_()
        c = G["c_bias"].clone().requires_grad_()
        n = pos[b].sum() * 2
        for e in range(E):
            z = (D + C) @ u + bb + c
            w = negc[e, b].float()
            bce = (w * torch.nn.functional.softplus(z) + pos[b] * torch.nn.functional.softplus(-z)).sum()
            gu, gb = torch.autograd.grad(bce / n, [u, bb], retain_graph=True)
            gD, gC, gc = torch.autograd.grad(bce, [D, C, c])
            with torch.no_grad():
                u -= 0.3 * gu
                bb -= 0.3 * gb
                D -= 0.15 * gD
                C -= 0.2 * gC
                c -= 0.07 * gc
        assert torch.allclose(new_p["D"][b], D, atol=1e-5)
        assert torch.allclose(upd[b, : m_items * k].view(m_items, k), C - G["C"], atol=1e-5)
        assert torch.allclose(upd[b, m_items * k :], c - G["c_bias"], atol=1e-5)
    g1 = model.apply_mean_update(G, upd.mean(0), 3)
    assert torch.allclose(g1["c_bias"], G["c_bias"] + 2.0 * upd[:, m_items * k :].mean(0), atol=1e-6)
    items = torch.tensor([[0, 3], [1, 6], [2, 5]])
    plain = FedRAP(B, m_items, k=k, item_bias=False)
    no_bias = plain.score(g1, new_p, data.users, items)
    assert torch.allclose(model.score(g1, new_p, data.users, items), no_bias + g1["c_bias"][items])
    assert FedRAP(B, m_items, variant="d_only", item_bias=True).update_dim == 0


def test_regulariser_pushes_d_and_c_apart() -> None:
    """The sign of the paper's Eq. (3): -lambda ||D - C||^2 is *maximised*."""
    data = CohortData(
        users=torch.tensor([0]),
        items=torch.zeros(1, 1, dtype=torch.long),
        mask=torch.zeros(1, 1, dtype=torch.bool),
        lengths=torch.zeros(1, dtype=torch.long),
    )
    m = FedRAP(1, 5, k=3, local_epochs=1, v1=0.1, curriculum="fixed", init_std_d=0.5, item_bias=False)
    G = m.init_global(gen())
    P = m.init_private(data, G, 1)
    new_p, upd = m.local_update(LocalRound(G, P, data, 0, 2))
    before = (P["D"][0] - G["C"]).norm()
    after = (new_p["D"][0] - (G["C"] + upd[0].view(5, 3))).norm()
    assert after > before


# ------------------------------------------------------------------ curriculum and prox


def test_curriculum_values() -> None:
    assert curriculum_weight("tanh", 0) == 0.0
    assert curriculum_weight("tanh", 10) == pytest.approx(math.tanh(1.0))
    assert curriculum_weight("tanh", 1000) == pytest.approx(1.0)
    assert curriculum_weight("fixed", 0) == curriculum_weight("fixed", 50) == 1.0
    assert curriculum_weight("frac", 0) == 1.0 and curriculum_weight("frac", 9) == pytest.approx(0.1)
    assert [curriculum_weight("square", a) for a in (0, 9, 10, 19, 20)] == [0, 0, 1, 1, 0]
    for a in range(200):
        for c in CURRICULA:
            assert 0.0 <= curriculum_weight(c, a) <= 1.0
    m = FedRAP(3, 4, v1=0.2, v2=0.05)
    assert m.lam(20) == pytest.approx(math.tanh(2.0) * 0.2)
    assert m.mu(20) == pytest.approx(math.tanh(2.0) * 0.05)
    assert FedRAP(3, 4, reg="none", v2=0.05).mu(20) == 0.0
    with pytest.raises(ValueError):
        curriculum_weight("cosine", 3)


def test_curriculum_is_applied_in_training() -> None:
    """Round 0 of tanh has lambda = 0 (no regulariser), later rounds do not."""
    data = CohortData(
        users=torch.tensor([0]),
        items=torch.zeros(1, 1, dtype=torch.long),
        mask=torch.zeros(1, 1, dtype=torch.bool),
        lengths=torch.zeros(1, dtype=torch.long),
    )
    m = FedRAP(1, 5, k=3, local_epochs=1, v1=0.1, init_std_d=0.5, item_bias=False)
    G = m.init_global(gen())
    P = m.init_private(data, G, 1)
    _, upd0 = m.local_update(LocalRound(G, P, data, 0, 2))
    _, upd20 = m.local_update(LocalRound(G, P, data, 20, 2))
    assert torch.count_nonzero(upd0) == 0 and torch.count_nonzero(upd20) > 0


def test_l1_proximal_step_makes_c_sparse() -> None:
    m = FedRAP(2, 50, k=8, reg="l1", v2=0.5, curriculum="fixed", lr_item=0.1, local_epochs=2, server_lr=1.0, lr_decay=1.0, item_bias=False)
    G = {"C": torch.randn(50, 8, generator=gen()) * 0.1}
    thr = 1.0 * 2 * 0.1 * 0.5
    G1 = m.apply_mean_update(G, torch.zeros(50 * 8), 5)
    c0, c1 = G["C"], G1["C"]
    assert torch.equal(c1 == 0, c0.abs() <= thr)
    keep = c0.abs() > thr
    assert torch.allclose(c1[keep], c0[keep] - thr * c0[keep].sign())
    assert (c1 == 0).float().mean() > 0.5
    # L2 ablation: a shrink, never exact zeros; none: untouched
    l2 = FedRAP(2, 50, k=8, v2=0.5, reg="l2", curriculum="fixed", lr_item=0.1, local_epochs=2, server_lr=1.0, lr_decay=1.0, item_bias=False)
    assert torch.allclose(l2.apply_mean_update(G, torch.zeros(400), 5)["C"], c0 / (1 + 2 * thr))
    none = FedRAP(2, 50, k=8, v2=0.5, reg="none", curriculum="fixed", item_bias=False)
    assert torch.equal(none.apply_mean_update(G, torch.zeros(400), 5)["C"], c0)


def test_bad_options_raise() -> None:
    with pytest.raises(ValueError):
        FedRAP(3, 4, variant="both")
    with pytest.raises(ValueError):
        FedRAP(3, 4, reg="l3")
    with pytest.raises(ValueError):
        FedRAP(3, 4, curriculum="linear")


# ------------------------------------------------------------------ learning


def test_learns_on_synthetic_data() -> None:
    x = synthetic(200, 300, seed=0)
    res = simulate(SimulationConfig(model="fedrap", dataset="synthetic", rounds=6, seed=0), interactions=x)
    assert res["best_val"]["hr@10"] > 0.35  # random ranking gives 0.1
    assert res["test"]["hr@10"] > 0.3
    assert 0.03 < res["placebo"]["hr@10"] < 0.2
    assert res["summary"]["c_zero_fraction"] == 0.0  # the default regulariser is L2 (docs/tuning.md)
    l1 = simulate(
        SimulationConfig(model="fedrap", dataset="synthetic", rounds=6, seed=0, params={"reg": "l1"}), interactions=x
    )
    assert l1["summary"]["c_zero_fraction"] > 0.0  # the paper's L1 prox is at work
    assert l1["best_val"]["hr@10"] > 0.35


def test_update_scale_only_changes_the_unit(synth_split) -> None:
    s = synth_split
    data = cohort_data(s, list(range(20)))
    a = FedRAP(s.n_users, s.n_items, k=4, local_epochs=1)
    b = FedRAP(s.n_users, s.n_items, k=4, local_epochs=1, update_scale=7.0)
    g0 = a.init_global(gen())
    p0 = a.init_private(data, g0, 1)
    _, ua = a.local_update(LocalRound(g0, p0, data, 4, 2))
    _, ub = b.local_update(LocalRound(g0, p0, data, 4, 2))
    assert torch.allclose(ub * 7.0, ua, atol=1e-5)
    assert torch.allclose(a.apply_mean_update(g0, ua.mean(0), 4)["C"], b.apply_mean_update(g0, ub.mean(0), 4)["C"], atol=1e-5)


def test_fedmf_keeps_its_own_defaults_when_fedraps_change() -> None:
    # FedMF is FedRAP's c_only core with its own tuned defaults: FedRAP's D78 choices must not leak into it
    from models.fedmf import FedMF

    mf, rap = FedMF(5, 7), FedRAP(5, 7)
    assert mf.recency == 0.0 and mf.v2 == 1e-4 and mf.weight_decay_u == 0.03
    assert rap.recency == 2.0 and rap.v2 == 3e-4 and rap.weight_decay_u == 0.05


def test_accelerator_chunk_follows_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA an inner chunk holds as many devices as a quarter of the free
    memory fits (at least 64, at most the cohort); the CPU keeps `chunk`."""
    from models.fedrap import FedRAP

    model = FedRAP(100, 3706, k=32, chunk=8)
    per = model.chunk_bytes(2 * 160)
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (4 * 1000 * per, 80 * 1024**3))
    assert model.accelerator_chunk(6040, 6040 * 160, cuda) == 1000
    assert model.accelerator_chunk(500, 500 * 160, cuda) == 500  # the whole cohort fits
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (4 * 10 * per, 80 * 1024**3))
    assert model.accelerator_chunk(6040, 6040 * 160, cuda) == 64  # never below 64
    assert model.accelerator_chunk(6040, 6040 * 160, torch.device("cpu")) == 64
