"""`simulate` over a subset of the users (the devices of a federation) and the
saved final global state."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from models.data.synthetic import synthetic
from models.sim.engine import SimulationConfigError, SimulationConfig, load_global_state, simulate
from models.keyed_random import global_init_generator


@pytest.fixture(scope="module")
def x():
    return synthetic(80, 200, seed=2)


def test_population_and_saved_global(x, tmp_path: Path) -> None:
    path = tmp_path / "g.npz"
    cfg = SimulationConfig(model="fedrap", rounds=2, users=tuple(range(1, 21)), save_global=str(path),
                           params={"k": 8, "server_lr": 1.0})  # fmt: skip
    res = simulate(cfg, interactions=x)
    assert res["population"] == 20 and res["cohort_size"] == 20
    assert res["rounds"][0]["val"]["n_users"] == 20 and res["test"]["n_users"] == 20
    assert res["saved_global"] == str(path)
    g = load_global_state(path)
    assert set(g) == {"C"} and g["C"].shape == (200, 8) and g["C"].dtype == np.float32
    # one round less is another model; the same run again is the same model
    simulate(SimulationConfig(**{**cfg.__dict__, "rounds": 1, "save_global": str(tmp_path / "g1.npz")}), interactions=x)
    assert not np.allclose(load_global_state(tmp_path / "g1.npz")["C"], g["C"])
    simulate(SimulationConfig(**{**cfg.__dict__, "save_global": str(tmp_path / "g2.npz")}), interactions=x)
    np.testing.assert_array_equal(load_global_state(tmp_path / "g2.npz")["C"], g["C"])


def test_initial_global_comes_from_the_seeded_global_generator(x, tmp_path: Path) -> None:
    """The engine starts from init_global(global_init_generator(seed)), the
    coordinator's version 1 for that seed (server_lr 0: the global never moves)."""
    from models.registry import build_model

    m = build_model("fedrap", explicit=False, n_users=x.n_users, n_items=x.n_items, overrides={"k": 8})
    for seed in (0, 7):
        g0 = m.init_global(global_init_generator(seed))
        cfg = SimulationConfig(model="fedrap", rounds=1, seed=seed, save_global=str(tmp_path / f"a{seed}.npz"),
                               params={"k": 8, "server_lr": 0.0})  # fmt: skip
        simulate(cfg, interactions=x)
        assert torch.equal(torch.from_numpy(load_global_state(tmp_path / f"a{seed}.npz")["C"]), g0["C"])


def test_bad_population(x) -> None:
    with pytest.raises(SimulationConfigError, match="must lie in"):
        simulate(SimulationConfig(model="fedrap", rounds=1, users=(0, 1)), interactions=x)
    with pytest.raises(SimulationConfigError, match="twice"):
        simulate(SimulationConfig(model="fedrap", rounds=1, users=(3, 3)), interactions=x)
    with pytest.raises(SimulationConfigError, match="clients-per-round"):
        simulate(SimulationConfig(model="fedrap", rounds=1, users=(1, 2, 3), clients_per_round=4), interactions=x)
