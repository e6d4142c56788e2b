"""The accelerator path (marker `cuda`): the keyed draws, every model through
the engine, and the edge client's trainer and top-k give on CUDA what they
give on the CPU.

Tolerances: float32 kernels differ between the two devices (CUDA's
`index_add_` adds with atomics, in no fixed order), so parameters are compared
within 1e-4 after a few rounds, relative to the parameter's largest magnitude
where that exceeds 1 (a sampled FedRAP cohort on this small population grows
entries of C past 100, where float32's own rounding is ~1e-5: two chunkings on
the CPU alone differ by 1.7e-4 there), never bit for bit; integer draws are
compared exactly. What the secure sum adds up is exact on both (its own tests).

Skipped, with the reason in the output, where torch sees no CUDA device.
With FEDMASK_TEST_ACCELERATOR=cpu the CPU stands in for the accelerator: that
rehearses the tests' own logic on a machine without a GPU (docs/gpu.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from models.data.synthetic import synthetic
from models.sim.engine import SimulationConfig, load_global_state, simulate

pytestmark = pytest.mark.cuda

PARAM_TOL = 1e-4  # max |cpu - accelerator| of a global parameter after a few rounds


@pytest.fixture(scope="module")
def accel() -> str:
    """The accelerator's torch device name (skips without one)."""
    forced = os.environ.get("FEDMASK_TEST_ACCELERATOR")
    if forced:
        return forced
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here (torch.cuda.is_available() is False); `make gpu-check` runs these on a GPU")
    return "cuda"


@pytest.fixture(scope="module")
def x():
    return synthetic(120, 260, seed=5)


def test_keyed_draws_are_the_same_on_the_accelerator(accel: str) -> None:
    """Negatives are integer hashes: bit for bit; keyed normals (Box-Muller in
    float64) within a few float64 ulps."""
    from models.data.sampling import NegativeSampler
    from models.keyed_random import KeyedStream, user_normal

    gen = torch.Generator().manual_seed(3)
    items = torch.randint(0, 500, (40, 30), generator=gen)
    lengths = torch.randint(1, 31, (40,), generator=gen)
    users = torch.arange(100, 140)
    stream = KeyedStream.of(7, 2, 4)
    cpu = NegativeSampler(items, lengths, 500, 4, users).draw(stream)
    dev = NegativeSampler(items.to(accel), lengths.to(accel), 500, 4, users.to(accel)).draw(stream)
    assert dev.device.type == torch.device(accel).type
    assert torch.equal(cpu, dev.cpu())
    a = user_normal(7, 1, users, (8,), 0.1)
    b = user_normal(7, 1, users.to(accel), (8,), 0.1)
    assert b.device.type == torch.device(accel).type
    assert float((a - b.cpu()).abs().max()) <= 1e-6


CASES = [
    pytest.param("fedrap", {}, id="fedrap"),
    pytest.param("fedrap", {"clients_per_round": 40}, id="fedrap-sampled-cohorts"),
    pytest.param("fedrap", {"secagg": True, "rounds": 2}, id="fedrap-secagg"),
    pytest.param("fedmf", {}, id="fedmf"),
    pytest.param("fedmf", {"explicit": True}, id="fedmf-explicit"),
    pytest.param("pfedrec", {}, id="pfedrec"),
    pytest.param("fedmmf", {"params": {"mask_steps": 20}}, id="fedmmf"),
]


@pytest.mark.parametrize(("model", "extra"), CASES)
def test_every_model_simulates_on_the_accelerator_as_on_the_cpu(
    accel: str, x, tmp_path: Path, model: str, extra: dict
) -> None:
    kw: dict = {"model": model, "rounds": 3, "seed": 2} | extra
    runs = []
    for role, dev in (("reference", "cpu"), ("accelerator", accel)):
        path = tmp_path / f"{role}.npz"
        res = simulate(SimulationConfig(device=dev, save_global=str(path), **kw), interactions=x)
        runs.append((res, load_global_state(path)))
    (res_c, g_c), (res_a, g_a) = runs
    assert sorted(g_c) == sorted(g_a)
    for name in g_c:
        diff = float(np.abs(g_c[name].astype(np.float64) - g_a[name]).max())
        scale = max(1.0, float(np.abs(g_c[name]).max()))
        assert diff <= PARAM_TOL * scale, f"{model} {name}: max |cpu - {accel}| = {diff:.3g} (max |{name}| {scale:.3g})"
    assert res_a["best_round"] == res_c["best_round"]
    n = res_c["n_users"]
    for key, v in res_c["test"].items():
        tol = 1e-4 if key in ("rmse", "mae") else 1.0 / n  # a rank metric moves by 1/n per flipped device
        assert abs(res_a["test"][key] - v) <= tol + 1e-12, (key, v, res_a["test"][key])


def test_dp_runs_on_the_accelerator_with_the_same_accounting(accel: str, x) -> None:
    """The DP noise is drawn on the device (a different draw than the CPU's,
    of the same distribution, D81); the epsilon is the same, and so are the
    first round's clipping and update norms (the same model and cohort before
    any noise; from the second round on the models differ by the noise)."""
    kw: dict[str, Any] = {"model": "fedmf", "rounds": 2, "dp_noise": 1.0, "dp_clip": 0.5, "clients_per_round": 60}
    cpu = simulate(SimulationConfig(device="cpu", **kw), interactions=x)
    dev = simulate(SimulationConfig(device=accel, **kw), interactions=x)
    assert dev["epsilon"] == pytest.approx(cpu["epsilon"], rel=1e-12)
    a, b = cpu["rounds"][0], dev["rounds"][0]
    assert a["clipped_fraction"] == pytest.approx(b["clipped_fraction"], abs=1e-6)
    assert a["update_norm_mean"] == pytest.approx(b["update_norm_mean"], rel=1e-4)
    assert all(r["update_norm_mean"] > 0 for r in dev["rounds"])


# ------------------------------------------------------------ the edge client


@pytest.fixture
def trainers(tmp_path: Path, accel: str):
    """The same 12 devices hosted twice: one trainer on the CPU, one on the accelerator."""
    from edge_client.devices import Device, local_id_of
    from edge_client.local_data import LocalData
    from edge_client.state import ClientStore
    from edge_client.trainer import Trainer

    interactions = synthetic(seed=0)
    out, stores = [], []
    for role, dev in (("reference", "cpu"), ("accelerator", accel)):
        root = tmp_path / role
        store = ClientStore(root).open()
        stores.append(store)
        data = LocalData(interactions, [Device(n, store.device(local_id_of(n))) for n in range(1, 13)], split_seed=0)
        assert data.prepare() == 12
        out.append(Trainer(data, seed=0, torch_device=dev, global_path=root / "global.fms"))
    yield out[0], out[1]
    for s in stores:
        s.close()


@pytest.mark.parametrize("name", ["fedrap", "pfedrec"])
def test_edge_client_trains_and_answers_top_k_on_the_accelerator(accel: str, trainers, name: str) -> None:
    from edge_client.queries import top_k
    from edge_client.task import TaskSpec

    cpu, dev = trainers
    assert dev.device.type == torch.device(accel).type
    hyper = {"k": 8, "local_epochs": 2}
    entry = cpu.model_for(name, hyper)
    g = entry.model.init_global(torch.Generator().manual_seed(11))
    spec = TaskSpec(
        model_name=name, model_version=3, round_number=2, round_idx=1, hyperparameters=hyper,
        global_params={k: v.numpy() for k, v in g.items()}, vector_length=entry.model.update_dim,
    )  # fmt: skip
    numbers = [2, 3, 5, 7, 11]
    a = cpu.train(spec, numbers).updates
    b = dev.train(spec, numbers).updates
    assert a.shape == b.shape and float(np.abs(a - b).max()) <= PARAM_TOL
    for n in numbers:
        items_c, scores_c, version = top_k(cpu, n, 10, exclude_seen=True)
        items_d, scores_d, version_d = top_k(dev, n, 10, exclude_seen=True)
        assert version == version_d == 3 and len(items_d) == 10
        assert scores_d == sorted(scores_d, reverse=True)
        np.testing.assert_allclose(scores_d, scores_c, atol=1e-4)
        for i, (ic, idv) in enumerate(zip(items_c, items_d, strict=True)):  # the same items but near ties
            assert ic == idv or abs(scores_c[i] - scores_d[i]) <= 1e-4, (n, i, ic, idv)


# ------------------------------------------------------------ the platform level (FREIB)


def _platform_interactions():
    return synthetic(n_users=60, n_items=40, seed=2, max_interactions=20, mean_interactions=12.0)


PLATFORM_PARAMS = {"k": 4, "k_bias": 3, "mlp": [4], "batch_size": 32, "local_epochs": 1}


@pytest.mark.parametrize("extra", [{}, {"ldp_scale": 0.05, "ldp_clip": 5.0}], ids=["freib", "freib-laplace"])
def test_freib_simulates_on_the_accelerator_as_on_the_cpu(accel: str, tmp_path: Path, extra: dict[str, Any]) -> None:
    """The platform-level simulation on the device; the Laplace noise is drawn on
    the CPU, so it is the same draw on both devices."""
    from models.sim.platform_runner import PlatformSimConfig, run_platform_simulation

    x = _platform_interactions()
    runs = []
    for role, dev in (("reference", "cpu"), ("accelerator", accel)):
        path = tmp_path / f"{role}.npz"
        cfg = PlatformSimConfig(model="freib", rounds=3, params=PLATFORM_PARAMS, device=dev, save_global=str(path), **extra)
        runs.append((run_platform_simulation(cfg, interactions=x), load_global_state(path)))
    (res_c, g_c), (res_a, g_a) = runs
    assert sorted(g_c) == sorted(g_a)
    for name in g_c:
        diff = float(np.abs(g_c[name].astype(np.float64) - g_a[name]).max())
        assert diff <= PARAM_TOL, f"freib {name}: max |cpu - {accel}| = {diff:.3g}"
    assert res_a["best_round"] == res_c["best_round"]
    assert res_a["test"]["rmse"] == pytest.approx(res_c["test"]["rmse"], abs=1e-4)


def test_a_platform_trains_on_the_accelerator_as_on_the_cpu(accel: str, tmp_path: Path) -> None:
    """An edge client hosting a platform (FREIB's cross-silo device) with
    `--device` on the accelerator sends the CPU's update and keeps its state on disk."""
    from coordinator.model_host import build_server_model
    from edge_client.devices import Device
    from edge_client.platform_trainer import PlatformHosting, PlatformTrainer, platform_local_id
    from edge_client.state import ClientStore
    from edge_client.task import TaskSpec
    from models.data.platforms import make_platform_split

    x = _platform_interactions()
    split = make_platform_split(x, n_platforms=5, beta=1.0, seed=0)
    lo, hi = split.rating_range
    hp = {"n_users": split.n_users, "n_items": split.n_items, "n_levels": len(split.levels),
          "center": (lo + hi) / 2.0, "n_platforms": 5, **PLATFORM_PARAMS}  # fmt: skip
    server = build_server_model("freib", hp)
    params = server.init_parameters(0)
    h = PlatformHosting(platform=2, n_platforms=5, beta=1.0)
    outs, stores = [], []
    try:
        for role, dev in (("reference", "cpu"), ("accelerator", accel)):
            store = ClientStore(tmp_path / role).open()
            stores.append(store)
            trainer = PlatformTrainer(x, h, Device(2, store.device(platform_local_id(h))), seed=0, torch_device=dev)
            assert trainer.device.type == torch.device(dev).type
            for step in range(2):  # the second round starts from the stored user rows
                task = TaskSpec(model_name="freib", model_version=step + 1, round_number=step + 1, round_idx=step,
                                hyperparameters={**server.hyperparameters(), "round_idx": step}, global_params=params,
                                vector_length=server.update_dim)  # fmt: skip
                out = trainer.train(task, [2])
            outs.append(out)
    finally:
        for s in stores:
            s.close()
    a, b = outs
    assert a.updates.shape == b.updates.shape == (1, server.update_dim)
    assert float(np.abs(a.updates - b.updates).max()) <= PARAM_TOL
    assert a.val_rows and b.val_rows
    assert b.val_rows[0]["sse"] == pytest.approx(a.val_rows[0]["sse"], rel=1e-4)
