"""A FedRAP federation over gRPC reaches the global model of `fedmask simulate`.

Real processes on 127.0.0.1: one coordinator (`fedmask coordinator`, FedRAP,
seed S, full cohort of 30 every round, consecutive participation allowed, no
DP, SecAgg over the complete graph) and three edge clients (`fedmask client
--dataset synthetic --seed S`, users 1-10, 11-20 and 21-30: 30 devices), for
three rounds. Then `fedmask simulate` with the same seed and settings
(`--users 1-30 --secagg --secagg-clip C --save-global`), and the coordinator's
last committed version must equal the simulated final global state.

Why they can agree: the coordinator's version 1 and simulate's initial state
are the same seeded draw (`models.keyed_random.global_init_generator`), both
sides give the model the same round index (the coordinator's step = simulate's
round), and every per-device draw of training (private initialisation,
negatives) is keyed by (seed, round, user id, ...), so a device trains the
same in a client process of 10 devices as in simulate's batch of 30.

Why they are not bit-identical, and the tolerance (see `tolerance()`): the
stochastic rounding of the secagg encoding comes from os.urandom on the
clients (it must: seeded rounding noise could be subtracted) and from a
seeded generator in simulate; and float32 reductions run over other batch
shapes. The negative checks (another seed, a 1% smaller item learning rate)
show that the comparison is far tighter than the effect of any real change.

`test_three_trainers_reach_the_simulated_model_in_process` is the same check
without processes and without quantisation (plain mean): the edge clients'
`Trainer` in three groups and the coordinator's model host against plain
`simulate`, equal up to float32 reduction order.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from integration_harness import Processes, client_args, coordinator_args, free_port, terminal_rounds, wait_serving

SEED = 3
ROUNDS = 3
GROUPS = ("1-10", "11-20", "21-30")
N = 30
CLIP = 16.0  # secagg fixed-point range [-16, 16]: no FedRAP update coordinate exceeds it here (asserted below)
N_USERS, N_ITEMS = 200, 300  # models.data.synthetic defaults
SERVER_LR = 10.0  # FedRAP's default (the clients build the model from the defaults, like simulate)
UPDATE_SCALE = 1.0


def quantisation_step(n: int = N, clip: float = CLIP, bits: int = 32) -> float:
    """One step of the secagg fixed-point encoding (secagg/encoding.py):
    max_level = (2^w - 1) // n levels over [-c, c]."""
    return 2 * clip / ((2**bits - 1) // n)


def tolerance(rounds: int = ROUNDS) -> float:
    """Largest |C_federation - C_simulate| accepted, per coordinate.

    Per round: both sides aggregate the same clipped float updates (keyed
    training) and decode a mean that is within one quantisation step of their
    exact mean (stochastic rounding moves each device's encoded coordinate by
    less than one step; the mean of n such errors is less than one step). So
    the two decoded means differ by < 2 steps, and the server step C += server_lr
    * update_scale * mean turns that into delta = 2 * server_lr * update_scale * step
    = 4.47e-6 per round (step = 2.24e-7 for n = 30, c = 16, 32 bits).

    Propagation: a difference in C changes the next round's training; the round
    map (local training + server step) has a measured gain of about 1.5 on
    such perturbations (perturbing every coordinate of the mean by +-2 steps in
    each of 3 rounds moves the final C by 1.35 to 1.5 * 3 * delta;
    `test_tolerance_covers_the_worst_quantisation_error` re-measures it). We
    allow a gain of 4: tol = 4 * rounds * delta = 5.36e-5. That also covers
    float32 reduction-order noise (|C| < 5: a few ulps, 5e-7 each, per round).
    The negative checks below move C by more than 100 times this.
    """
    delta = 2 * SERVER_LR * UPDATE_SCALE * quantisation_step()
    return 4 * rounds * delta


def _simulate_in_process(tmp_path: Path, name: str, **over: Any) -> np.ndarray:
    from models.sim.engine import SimulationConfig, load_global_state, simulate

    kw: dict[str, Any] = dict(model="fedrap", dataset="synthetic", seed=SEED, rounds=ROUNDS, users=tuple(range(1, N + 1)),
              secagg=True, secagg_clip=CLIP, secagg_neighbors="all", threads=1, eval_every=ROUNDS)  # fmt: skip
    kw.update(over)
    path = tmp_path / f"{name}.npz"
    simulate(SimulationConfig(**kw, save_global=str(path)))
    return load_global_state(path)["C"]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_federation_over_grpc_reaches_the_simulated_model(procs: Processes, tmp_path: Path) -> None:
    from coordinator.store.blobs import unpack_parameters
    from integration_harness import open_store_readonly

    url = f"sqlite:///{tmp_path / 'coordinator.db'}"
    port = free_port()
    coord = procs.start("coordinator", coordinator_args(
        port, url,
        model="fedrap", model_params={"n_users": N_USERS, "n_items": N_ITEMS},
        cohort_size=N, cohort_minimum=N, over_selection=0.0, allow_consecutive=True,
        rounds=ROUNDS, seed=SEED, selection_deadline=60,
        secagg_graph="full", secagg_clip=CLIP, dp_mode="none",
    ))  # fmt: skip
    wait_serving(port, coord)
    clients = [
        procs.start(f"client-{i}", client_args(port, users, tmp_path / f"client-{i}", dataset="synthetic",
                                               seed=SEED, threads=1))  # fmt: skip
        for i, users in enumerate(GROUPS)
    ]
    coord.wait(300)  # --rounds: the coordinator exits by itself after the last round
    assert coord.returncode == 0, coord.tail()
    procs.check_alive(*clients)

    records = terminal_rounds(url)
    assert [r.number for r in records] == list(range(1, ROUNDS + 1)), records
    for r in records:
        assert r.state.value == "committed", r
        assert sorted(r.survivors["masked_input"]) == list(range(1, N + 1)), r.survivors  # all 30, no dropout
    store = open_store_readonly(url)
    try:
        version = store.latest_model_version("fedrap")
        assert version is not None and version.hyperparameters["step"] == ROUNDS
        fed = unpack_parameters(version.parameters)["C"]
    finally:
        store.close()

    # `fedmask simulate` with the same seed and settings, as a command
    sim = procs.start("simulate", [
        "simulate", "--model", "fedrap", "--dataset", "synthetic", "--seed", SEED, "--rounds", ROUNDS,
        "--users", "1-30", "--secagg", "--secagg-clip", CLIP, "--secagg-neighbors", "all",
        "--save-global", tmp_path / "simulated.npz", "--out", tmp_path / "sim", "--threads", "1",
        "--eval-every", ROUNDS, "--quiet",
    ])  # fmt: skip
    assert sim.wait(240) == 0, sim.tail()
    from models.sim.engine import load_global_state

    simulated = load_global_state(tmp_path / "simulated.npz")["C"]
    results = json.loads((tmp_path / "sim" / "results.json").read_text())
    assert results["population"] == N and results["cohort_size"] == N
    assert all(rec["secagg_clipped_fraction"] == 0.0 for rec in results["rounds"])  # no clipping: see tolerance()

    assert fed.shape == simulated.shape == (N_ITEMS, 32)
    diff = float(np.abs(fed - simulated).max())
    tol = tolerance()
    scale = float(np.abs(simulated).max())
    print(f"max |C_fed - C_sim| = {diff:.3g} (tolerance {tol:.3g}; max |C| = {scale:.3g})")
    assert diff <= tol, f"federation and simulate differ by {diff:.3g} > {tol:.3g}"

    # the comparison can fail: another seed or a 1% smaller item learning rate is far outside it
    other_seed = _simulate_in_process(tmp_path, "seed", seed=SEED + 1)
    other_lr = _simulate_in_process(tmp_path, "lr", params={"lr_item": 2.97})
    d_seed = float(np.abs(other_seed - fed).max())
    d_lr = float(np.abs(other_lr - fed).max())
    print(f"negative checks: another seed {d_seed:.3g}, lr_item 2.97 {d_lr:.3g}")
    assert d_seed > 100 * tol and d_lr > 100 * tol, (d_seed, d_lr, tol)


def test_tolerance_covers_the_worst_quantisation_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gain assumed by `tolerance()`: simulate with the mean of every round
    moved by the largest difference two secagg decodings can have (2 steps, a
    random sign per coordinate) stays within the tolerance of the exact run."""
    import torch

    import models.sim.engine as engine

    def shifted_mean(updates, *, round_idx, **kw):  # noqa: ANN001, ANN003, ANN202
        g = torch.Generator().manual_seed(100 + round_idx)
        sign = torch.randint(0, 2, (updates.shape[1],), generator=g) * 2 - 1
        return updates.mean(0) + 2 * quantisation_step() * sign

    exact = _simulate_in_process(tmp_path, "exact", secagg=False)
    # the round keeps its table (no stream, D100) and its mean is the exact one moved by two steps
    monkeypatch.setattr(engine, "round_streams", lambda *args: (None, None))
    monkeypatch.setattr(engine, "aggregate_round", shifted_mean)
    shifted = _simulate_in_process(tmp_path, "shifted")
    diff = float(np.abs(shifted - exact).max())
    delta = 2 * SERVER_LR * UPDATE_SCALE * quantisation_step()
    print(f"worst-case quantisation: max diff {diff:.3g} = {diff / (ROUNDS * delta):.2f} * rounds * delta")
    assert ROUNDS * delta / 2 < diff <= tolerance(), diff


def test_coordinator_starts_from_the_simulated_initial_model() -> None:
    """Version 1 of the coordinator (model_host.init_parameters(seed)) is the
    engine's initial global state for the same seed."""
    from coordinator.model_host import build_server_model
    from models.registry import build_model
    from models.keyed_random import global_init_generator

    server = build_server_model("fedrap", {"n_users": N_USERS, "n_items": N_ITEMS})
    model = build_model("fedrap", explicit=False, n_users=N_USERS, n_items=N_ITEMS)
    for seed in (0, SEED):
        want = model.init_global(global_init_generator(seed))["C"].numpy()
        np.testing.assert_array_equal(server.init_parameters(seed)["C"], want)
    assert not np.array_equal(server.init_parameters(SEED)["C"], server.init_parameters(SEED + 1)["C"])


def test_three_trainers_reach_the_simulated_model_in_process(tmp_path: Path) -> None:
    """The edge clients' trainer (three groups of 10 devices, state on disk) with
    the coordinator's server step and a plain mean equals plain `simulate`
    over users 1-30, up to float32 reduction order (no quantisation here)."""
    from coordinator.model_host import build_server_model
    from edge_client.state import ClientStore
    from edge_client.devices import Device, local_id_of
    from edge_client.local_data import LocalData
    from edge_client.task import TaskSpec
    from edge_client.trainer import Trainer
    from edge_client.users import parse_user_ranges
    from models.data.synthetic import synthetic

    x = synthetic(seed=SEED)
    server = build_server_model("fedrap", {"n_users": N_USERS, "n_items": N_ITEMS})
    params = server.init_parameters(SEED)
    stores, groups = [], []
    for i, spec in enumerate(GROUPS):
        store = ClientStore(tmp_path / f"client-{i}").open()
        stores.append(store)
        numbers = parse_user_ranges(spec)
        data = LocalData(x, [Device(n, store.device(local_id_of(n))) for n in numbers], split_seed=SEED)
        data.prepare()
        t = Trainer(data, seed=SEED)
        groups.append((t, numbers))
    try:
        for step in range(ROUNDS):
            task = TaskSpec(
                model_name="fedrap", model_version=step + 1, round_number=step + 1, round_idx=step,
                hyperparameters={**server.hyperparameters(), "round_idx": step}, global_params=params,
                vector_length=server.update_dim,
            )  # fmt: skip
            updates = np.concatenate([t.train(task, numbers).updates for t, numbers in groups])
            assert updates.shape == (N, server.update_dim)
            params = server.apply_mean(params, updates.mean(0), step)
    finally:
        for s in stores:
            s.close()
    simulated = _simulate_in_process(tmp_path, "plain", secagg=False)
    diff = float(np.abs(params["C"] - simulated).max())
    print(f"in process: max |C_trainers - C_simulate| = {diff:.3g}")
    # float32 reduction order only: a few ulps of |C| < 5 per round, amplified like in tolerance()
    assert diff <= 1e-5, diff
    other = _simulate_in_process(tmp_path, "plain-other", secagg=False, seed=SEED + 1)
    assert float(np.abs(params["C"] - other).max()) > 1e-2
