"""FREIB on tiny data: shapes, gradients, the ablation switches, prototypes, SecAgg equivalence, Laplace LDP."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from models.data.platforms import make_platform_split
from models.data.synthetic import synthetic
from models.data.types import Interactions
from models.freib import PlatformData, PlatformModel, forward, local_prototypes, local_train, server_step
from models.laplace_ldp import clip_l1, epsilon_per_release, epsilon_total, laplace_noise, privatize_laplace
from models.sim.platform_runner import PlatformSimConfig, run_platform_simulation
from models.platforms import build_platform_model, platform_data


def tiny(**kw: Any) -> PlatformModel:
    base: dict[str, Any] = dict(n_users=6, n_items=7, n_levels=3, k=4, k_bias=3, mlp=(4,), batch_size=3, local_epochs=2, lr=0.05)
    base.update(kw)
    return PlatformModel(**base)


def tiny_data() -> PlatformData:
    # platform 0: users 0-2, platform 1: users 3-5 (4 and 6 ratings: the shorter one sits out steps)
    users = torch.tensor([[0, 1, 2, 0, 0, 0], [3, 4, 5, 3, 4, 5]])
    items = torch.tensor([[0, 1, 2, 3, 0, 0], [1, 2, 4, 5, 6, 0]])
    ratings = torch.tensor([[1.0, 2.0, 3.0, 3.0, 0, 0], [1.0, 1.0, 3.0, 2.0, 3.0, 2.0]])
    level = (ratings - 1).clamp(min=0).long()
    return PlatformData(torch.arange(2), users, items, ratings, level, torch.tensor([4, 6]))


def shared_changes(model: PlatformModel, shared: dict[str, torch.Tensor], upload: torch.Tensor) -> dict[str, torch.Tensor]:
    """One platform's upload split into its shared-parameter changes, by name and in their shapes."""
    names = model.shared_names()
    parts = torch.split(upload[: model.shared_dim()], [shared[n].numel() for n in names])
    return {n: part.view(shared[n].shape) for n, part in zip(names, parts)}


def state(model: PlatformModel, M: int = 2) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    return (
        model.init_shared(torch.Generator().manual_seed(0)),
        model.init_user(torch.arange(model.n_users), 0),
        model.init_platform(M),
    )


def test_forward_shapes_and_bias_encoder_adds_a_score() -> None:
    m = tiny()
    shared, user, _ = state(m)
    par = {k: v.unsqueeze(0).expand(2, *v.shape) for k, v in shared.items()} | user
    d = tiny_data()
    r_o, r_b, e, _ = forward(m, par, d.users, d.items)
    assert r_o.shape == r_b.shape == (2, 6) and e is not None and e.shape == (2, 6, 3)
    assert not torch.allclose(r_o, r_b)
    m0 = tiny(bias_encoder=False)
    s0, u0, _ = state(m0)
    par0 = {k: v.unsqueeze(0).expand(2, *v.shape) for k, v in s0.items()} | u0
    r_o0, r_p0, e0, _ = forward(m0, par0, d.users, d.items)
    assert e0 is None and torch.equal(r_o0, r_p0)
    assert "Eb" not in s0 and m0.update_dim == m0.shared_dim() < m.update_dim


def test_gradients_reach_every_part_of_the_loss() -> None:
    m = tiny()
    shared, user, _ = state(m)
    d = tiny_data()
    par = {k: v.unsqueeze(0).expand(2, *v.shape).clone().requires_grad_(True) for k, v in shared.items()}
    par |= {k: v.clone().requires_grad_(True) for k, v in user.items()}
    r_o, r_b, e, _ = forward(m, par, d.users, d.items)
    assert e is not None
    G = torch.randn(3, 3)
    loss = ((r_o - d.ratings) ** 2).mean() + ((r_b - d.ratings) ** 2).mean() + ((e - G[d.level]) ** 2).mean()
    loss.backward()
    for name, p in par.items():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def _run(m: PlatformModel, round_idx: int, protos: torch.Tensor | None) -> tuple[dict[str, float], torch.Tensor]:
    shared, user, plat = state(m)
    res = local_train(m, shared, user, plat, tiny_data(), protos, round_idx, seed=3)
    return res.losses, res.update


def test_ablation_flags_switch_each_part_off() -> None:
    G = torch.randn(3, 3)
    full, _ = _run(tiny(), 1, G)
    assert full["bias"] > 0 and full["distill"] > 0 and full["proto"] > 0
    no_guid, _ = _run(tiny(guidance=False), 1, G)
    assert no_guid["distill"] == 0 and no_guid["proto"] > 0
    no_proto, u = _run(tiny(prototypes=False), 1, G)
    assert no_proto["proto"] == 0 and no_proto["distill"] > 0 and u.shape[1] == tiny().shared_dim()
    no_bias, _ = _run(tiny(bias_encoder=False), 1, G)
    assert no_bias["bias"] == 0 and no_bias["proto"] == 0 and no_bias["distill"] > 0
    first, _ = _run(tiny(), 0, None)  # round 0: no frozen global model yet, no global prototypes
    assert first["distill"] == 0 and first["proto"] == 0
    # tau really weighs the prototype term: a different tau, a different update
    _, u1 = _run(tiny(tau=1.0), 1, G)
    _, u10 = _run(tiny(tau=10.0), 1, G)
    assert not torch.allclose(u1, u10)


def test_local_train_is_per_platform_and_does_not_touch_inputs() -> None:
    m = tiny(batch_size=2)  # platform 0: 2 steps per epoch, platform 1: 3 (platform 0 sits out the third)
    shared, user, plat = state(m)
    before = {k: v.clone() for k, v in shared.items()}
    d = tiny_data()
    G = torch.randn(3, 3)
    both = local_train(m, shared, user, plat, d, G, 1, seed=5)
    assert all(torch.equal(before[k], shared[k]) for k in shared)
    for row in (0, 1):
        alone = local_train(m, shared, user, plat, d.row(row), G, 1, seed=5)
        assert torch.allclose(alone.update[0], both.update[row], atol=1e-5)
    assert both.update.shape == (2, m.update_dim)


def test_prototypes_and_server_step() -> None:
    m = tiny()
    d = tiny_data()
    Eb = torch.randn(2, 7, 3)
    P, has = local_prototypes(m, Eb, d)
    assert P.shape == (2, 3, 3) and has.tolist() == [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    # platform 0, level 2 (rating 3): items 2 and 3
    assert torch.allclose(P[0, 2], (Eb[0, 2] + Eb[0, 3]) / 2)
    shared = m.init_shared(torch.Generator().manual_seed(0))
    zeros = torch.zeros(m.shared_dim())
    # level 0 only on platform 1: its global prototype is platform 1's, not halved
    has = torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    Pm = torch.randn(2, 3, 3) * has.unsqueeze(2)
    mean = torch.cat([zeros, Pm.reshape(2, -1).mean(0), has.mean(0)])
    new, G = server_step(m, shared, mean, 2)
    assert G is not None
    assert all(torch.equal(new[k], shared[k]) for k in shared)
    assert torch.allclose(G[0], Pm[1, 0]) and torch.allclose(G[1], (Pm[0, 1] + Pm[1, 1]) / 2)


def test_laplace_mechanism_scale_and_epsilon() -> None:
    g = torch.Generator().manual_seed(0)
    x = laplace_noise((200_000,), scale=0.05, generator=g).double()
    # Laplace(0, b): mean |x| = b, variance 2 b^2
    assert abs(float(x.abs().mean()) - 0.05) < 0.001
    assert abs(float(x.var()) - 2 * 0.05**2) < 2e-4
    rows = torch.tensor([[3.0, -4.0, 1.0], [0.1, 0.1, 0.0]])
    c, norms = clip_l1(rows, clip=2.0)
    assert torch.allclose(norms, torch.tensor([8.0, 0.2]))
    assert torch.allclose(c.abs().sum(1), torch.tensor([2.0, 0.2]))
    assert epsilon_per_release(clip=2.0, scale=0.1) == pytest.approx(40.0)
    assert epsilon_total(clip=2.0, scale=0.1, releases=5) == pytest.approx(200.0)
    noisy, _ = privatize_laplace(rows, clip=2.0, scale=0.1, generator=g)
    assert noisy.shape == rows.shape and not torch.allclose(noisy, c)
    with pytest.raises(ValueError):
        laplace_noise((3,), scale=0.0, generator=g)


def _tiny_dataset() -> Interactions:
    return synthetic(n_users=60, n_items=40, seed=2, max_interactions=20, mean_interactions=12.0)


def test_end_to_end_secagg_equals_plain_mean_up_to_quantisation() -> None:
    x = _tiny_dataset()
    p = {"k": 4, "k_bias": 3, "mlp": [4], "batch_size": 32, "local_epochs": 1}
    plain = run_platform_simulation(PlatformSimConfig(model="freib", rounds=2, params=p), interactions=x)
    sec = run_platform_simulation(
        PlatformSimConfig(model="freib", rounds=2, params=p, secagg=True, secagg_clip=4.0), interactions=x
    )
    assert sec["rounds"][0]["secagg_exact"] and sec["rounds"][0]["secagg_counted"] == 5
    assert sec["rounds"][0]["secagg_graph"]  # complete graph of the 5 platforms
    for a, b in zip(plain["rounds"], sec["rounds"], strict=True):
        assert a["val"]["rmse"] == pytest.approx(b["val"]["rmse"], abs=1e-4)
    assert plain["test"]["rmse"] == pytest.approx(sec["test"]["rmse"], abs=1e-4)
    assert math.isfinite(plain["test"]["mae"]) and plain["n_platforms"] == 5


def test_end_to_end_laplace_ldp_reports_epsilon_and_baselines_run() -> None:
    x = _tiny_dataset()
    p = {"k": 4, "batch_size": 32, "local_epochs": 1}
    r = run_platform_simulation(
        PlatformSimConfig(model="fedmf", rounds=2, params=p, ldp_scale=0.01, ldp_clip=5.0), interactions=x
    )
    assert r["ldp"]["epsilon_per_release"] == pytest.approx(1000.0)
    assert r["ldp"]["epsilon_total_basic_composition"] == pytest.approx(2000.0)
    for name in ("pfedrec", "central-mf"):
        out = run_platform_simulation(PlatformSimConfig(model=name, rounds=1, params=p), interactions=x)
        assert math.isfinite(out["test"]["rmse"])


def test_platform_data_groups_ratings_by_platform() -> None:
    x = _tiny_dataset()
    s = make_platform_split(x, n_platforms=3, beta=1.0, seed=0)
    d = platform_data(s, s.user_platform, 3)
    assert int(d.lengths.sum()) == len(s.train)
    for m in range(3):
        us = d.users[m, : int(d.lengths[m])].numpy()
        assert np.all(s.user_platform[us] == m)
    mdl = build_platform_model("freib", s, {}, ("guidance",))
    assert not mdl.guidance and mdl.bias_encoder and mdl.center == pytest.approx(sum(s.rating_range) / 2)


def test_cli_simulate_freib_with_ldp(tmp_path: Path, command_app: Any) -> None:
    import json

    from typer.testing import CliRunner

    from fedmask.commands.simulate import register_simulate

    app = command_app(register_simulate)
    out = tmp_path / "run"
    args = ["simulate", "--model", "freib", "--platforms", "5", "--dirichlet-beta", "0.5", "--dataset", "synthetic",
            "--rounds", "2", "--out", str(out), "-q", "-p", "k=4", "-p", "local_epochs=1", "--ablate", "prototypes",
            "--ldp-scale", "0.1", "--ldp-clip", "2"]  # fmt: skip
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "epsilon 40 per release" in r.output
    res = json.loads((out / "results.json").read_text())
    assert res["model"] == "freib" and res["dirichlet_beta"] == 0.5 and not res["model_config"]["prototypes"]
    assert (out / "metrics.png").exists()
    bad = CliRunner().invoke(app, ["simulate", "--model", "freib", "--dataset", "synthetic", "--out", str(out),
                                   "--clients-per-round", "3"])  # fmt: skip
    assert bad.exit_code == 2 and "device-level" in bad.output


def test_user_bias_is_a_private_offset_that_training_moves() -> None:
    """user_bias=True (a D67 candidate, off by default): b_u is a user parameter,
    never uploaded, added to r_o, and local training moves the rows of the platform's users."""
    m = tiny(user_bias=True)
    assert ("bu", "user", (), -1.0) in m.specs() and "bu" not in m.shared_names()
    assert m.update_dim == tiny().update_dim
    shared, user, plat = state(m)
    assert torch.equal(user["bu"], torch.zeros(6))
    res = local_train(m, shared, user, plat, tiny_data(), None, 0, 0)
    assert bool((res.user["bu"] != 0).all())
    par = {k: v.unsqueeze(0).expand(2, *v.shape) for k, v in shared.items()} | res.user
    d = tiny_data()
    r_o, _, _, _ = forward(m, par, d.users, d.items)
    par0 = dict(par, bu=torch.zeros(6))
    r_o0, _, _, _ = forward(m, par0, d.users, d.items)
    assert torch.allclose(r_o - r_o0, res.user["bu"][d.users])


def test_decay_embeddings_false_keeps_weight_decay_off_the_embedding_rows() -> None:
    """Item 6 is rated by no platform: dense weight decay shrinks its rows;
    with decay_embeddings=False they stay as they were while the network weights still decay."""
    d = PlatformData(torch.arange(1), torch.tensor([[0, 1]]), torch.tensor([[0, 1]]), torch.tensor([[1.0, 3.0]]),
                     torch.tensor([[0, 2]]), torch.tensor([2]))  # fmt: skip
    out = {}
    for flag in (True, False):
        m = tiny(weight_decay=0.5, decay_embeddings=flag, guidance=False, prototypes=False)
        shared, user, plat = state(m, M=1)
        res = local_train(m, shared, user, plat, d, None, 0, 0)
        upd = shared_changes(m, shared, res.update[0])
        out[flag] = {n: upd[n] for n in ("Qg", "Eb", "W0")}
    assert bool((out[True]["Qg"][6] != 0).all()) and bool((out[True]["Eb"][6] != 0).all())
    assert torch.equal(out[False]["Qg"][6], torch.zeros(4)) and torch.equal(out[False]["Eb"][6], torch.zeros(3))
    assert float(out[False]["W0"].abs().sum()) > 0  # the network weights still move


def test_a_diverging_platform_run_stops_and_counts_only_the_releases_made() -> None:
    x = _tiny_dataset()
    p = {"k": 4, "batch_size": 32, "local_epochs": 1, "lr": 10.0, "lr_decay": 1.0}  # overflows in a few rounds
    r = run_platform_simulation(
        PlatformSimConfig(model="fedmf", rounds=8, params=p, ldp_scale=0.01, ldp_clip=5.0), interactions=x
    )
    at = r["diverged_at_round"]
    assert 0 < at < 7 and len(r["rounds"]) == at + 1 and r["best_round"] < at
    assert math.isfinite(r["test"]["rmse"])
    # every round that ran released an upload: epsilon counts them, no more and no fewer
    assert r["ldp"]["releases_per_platform"] == at + 1
    assert r["ldp"]["epsilon_total_basic_composition"] == pytest.approx((at + 1) * r["ldp"]["epsilon_per_release"])


def test_local_fraction_trains_on_a_keyed_share_of_each_platform_and_keeps_rows_separable() -> None:
    """With local_fraction 0.5 an epoch visits the first ceil(L/2) ratings of the
    keyed order: exactly the items of those ratings move (no weight decay), and a
    platform trained alone still equals its row of the stacked run."""
    from models.freib import _order

    m = tiny(batch_size=1, local_epochs=1, local_fraction=0.5, weight_decay=0.0, guidance=False, prototypes=False)
    shared, user, plat = state(m)
    d = tiny_data()
    res = local_train(m, shared, user, plat, d, None, 2, seed=3)
    order = _order(d, 3, 2, 0)
    for row, n in ((0, 2), (1, 3)):  # lengths 4 and 6
        used = {int(d.items[row, j]) for j in order[row, :n]}
        q_change = shared_changes(m, shared, res.update[row])["Qg"]
        moved = {i for i in range(m.n_items) if bool((q_change[i] != 0).any())}
        assert moved == used
        alone = local_train(m, shared, user, plat, d.row(row), None, 2, seed=3)
        assert torch.allclose(alone.update[0], res.update[row], atol=1e-5)
    with pytest.raises(ValueError, match="local_fraction"):
        tiny(local_fraction=0.0)
