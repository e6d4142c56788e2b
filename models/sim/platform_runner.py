"""`fedmask simulate --platforms M`: a platform-level federation in one process.

The FREIB protocol (models/data/platforms.py for the split, models/freib.py
for the models). Each round (the paper's communication epoch):

1. every platform runs `local_train` from the global parameters and
   prototypes (all M stacked in one set of tensor ops);
2. optionally, the paper's Laplace local DP: every upload is clipped to L1
   norm C and gets Laplace(0, lambda) noise on the platform, before anything
   leaves it (models/laplace_ldp.py; epsilon per release = 2C / lambda);
3. aggregation: the plain mean of the M uploads, or with `secagg` the real
   Bonawitz protocol in process (`models.sim.aggregation.SecureAggregator`, i.e.
   `secagg.inprocess.run_round`) on the complete graph of the M platforms with
   the majority threshold floor(M/2) + 1; the library checks that the
   unmasked sum equals the sum of the encoded inputs;
4. `server_step`: FedAvg of the shared parameters and the global prototypes;
5. validation RMSE/MAE (each user scored by its own platform's model).

The round with the best validation RMSE is kept and scored on the test part
once. Models: freib (with ablations through `params`), fedmf, pfedrec, and
central-mf (a centralised biased MF: one "platform" holding every user,
no federation, the yardstick on the same split).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from models.base import resolve_device
from models.data.platforms import PlatformSplit, Ratings, make_platform_split
from models.data.types import Interactions
from models.freib import Params, PlatformModel, local_train, params_to, predict, server_step
from models.platforms import DEFAULT_PLATFORM_ROUNDS, PlatformConfigError, build_platform_model, platform_data
from models.sim.aggregation import SecureAggregator
from models.sim.events import SimulationEvents, close_round


SECAGG_PLATFORM_CLIP = 32.0


@dataclass(frozen=True)
class PlatformSimConfig:
    model: str
    dataset: str = "ml-100k"
    seed: int = 0
    n_platforms: int = 5
    beta: float = 1.0
    rounds: int | None = None
    ablate: tuple[str, ...] = ()
    secagg: bool = False
    secagg_clip: float | None = None
    ldp_scale: float | None = None  # the paper's lambda
    ldp_clip: float | None = None  # L1 bound C of an upload
    eval_every: int = 1
    threads: int | None = 1  # one thread: the tensors are small, a second thread only adds synchronisation
    data_dir: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    #: write the FINAL global state (shared parameters, prototypes and their
    #: presence flags: models/platform_federation.py) to this .npz
    save_global: str | None = None
    device: str = "cpu"  # cpu or cuda[:N]: where the platforms train (the draws are made on the CPU)


def evaluate_platforms(
    model: PlatformModel,
    shared: Params,
    user: Params,
    platform: Params,
    part: Ratings,
    user_platform: np.ndarray,
    rating_range: tuple[float, float],
) -> dict[str, float]:
    """RMSE / MAE over `part`, each rating predicted by its user's platform, clipped to the rating range."""
    from models.evaluation import finalize, merge_sums, rating_sums

    plat = user_platform[part.user]
    dev = next(iter(user.values())).device  # where the state lives
    sums = [{"sse": 0.0, "sae": 0.0, "rating_count": 0.0}]
    with torch.no_grad():
        for m in np.unique(plat):
            rows = np.flatnonzero(plat == m)
            users, items = torch.from_numpy(part.user[rows]).to(dev), torch.from_numpy(part.item[rows]).to(dev)
            pred = predict(model, shared, user, platform, int(m), users, items)
            sums.append(rating_sums(pred, torch.from_numpy(part.rating[rows]).to(dev), None, rating_range))
    out = finalize(merge_sums(sums))
    return {"rmse": out["rmse"], "mae": out["mae"], "n_ratings": out["n_ratings"]}


def _check(config: PlatformSimConfig) -> None:
    if config.n_platforms < 1:
        raise PlatformConfigError("--platforms must be >= 1")
    if not config.beta > 0:
        raise PlatformConfigError("--dirichlet-beta must be > 0")
    if config.rounds is not None and config.rounds < 1:
        raise PlatformConfigError("--rounds must be >= 1")
    if config.eval_every < 1:
        raise PlatformConfigError("--eval-every must be >= 1")
    if (config.ldp_scale is None) != (config.ldp_clip is None):
        raise PlatformConfigError("Laplace local DP needs both --ldp-scale LAMBDA and --ldp-clip C")
    if config.ldp_scale is not None and not (config.ldp_scale > 0 and (config.ldp_clip or 0) > 0):
        raise PlatformConfigError("--ldp-scale and --ldp-clip must be > 0")
    if config.secagg and (config.model == "central-mf" or config.n_platforms < 3):
        raise PlatformConfigError(
            "--secagg needs at least 3 platforms (a majority threshold below the cohort) and a federated model"
        )
    if config.secagg_clip is not None and not config.secagg_clip > 0:
        raise PlatformConfigError("--secagg-clip must be > 0")


def run_platform_simulation(
    config: PlatformSimConfig,
    *,
    interactions: Interactions | None = None,
    events: SimulationEvents | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run a platform-level federation; returns the results dict (results.json).
    `events` hears of every round (the CLI shows them as progress)."""
    from models.data.entry import load_interactions
    from models.keyed_random import global_init_generator
    from models.laplace_ldp import privatize_laplace
    from models.registry import ConfigError

    t_start = time.perf_counter()
    _check(config)
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        x = interactions if interactions is not None else load_interactions(config.dataset, config.data_dir, config.seed)
    except ConfigError as e:
        raise PlatformConfigError(str(e)) from e
    try:
        split = make_platform_split(x, n_platforms=config.n_platforms, beta=config.beta, seed=config.seed)
    except ValueError as e:
        raise PlatformConfigError(str(e)) from e
    central = config.model == "central-mf"
    M = 1 if central else split.n_platforms
    user_platform = np.zeros(split.n_users, dtype=np.int64) if central else split.user_platform
    model = build_platform_model(config.model, split, config.params, config.ablate)
    rounds = config.rounds if config.rounds is not None else DEFAULT_PLATFORM_ROUNDS[config.model]
    device = resolve_device(config.device, PlatformConfigError)
    data = platform_data(split, user_platform, M).to(device)

    # drawn on the CPU (the coordinator's and the keyed draws), then moved: the same start on every device
    shared = params_to(model.init_shared(global_init_generator(config.seed)), device)
    user = params_to(model.init_user(torch.arange(split.n_users), config.seed), device)
    platform = params_to(model.init_platform(M), device)
    protos: torch.Tensor | None = None
    secure = SecureAggregator(seed=config.seed, neighbors="all") if config.secagg else None
    ldp_gen = torch.Generator().manual_seed(int(np.random.SeedSequence([config.seed, 5]).generate_state(1)[0]))
    ldp_clip, ldp_scale = config.ldp_clip, config.ldp_scale  # both set or both None (_check)
    best: dict[str, Any] = {"round": None, "rmse": math.inf}
    records: list[dict[str, Any]] = []
    diverged_at: int | None = None
    t_setup = time.perf_counter() - t_start
    ev = events or SimulationEvents()
    for r in range(rounds):
        ev.round_started(r, rounds)
        t0 = time.perf_counter()
        res = local_train(model, shared, user, platform, data, protos, r, config.seed)
        upd = res.update
        rec: dict[str, Any] = {"round": r, "loss": res.losses}
        if ldp_clip is not None and ldp_scale is not None:
            upd, norms = privatize_laplace(upd, clip=ldp_clip, scale=ldp_scale, generator=ldp_gen)
            rec["upload_l1_mean"] = float(norms.mean())
            rec["ldp_clipped_fraction"] = float((norms > ldp_clip).float().mean())
        if secure is not None:
            c = config.secagg_clip if config.secagg_clip is not None else SECAGG_PLATFORM_CLIP
            mean = secure.mean(upd, round_idx=r, clip=c)
            rec.update(secure.last)
            rec["secagg_clipped_fraction"] = float((upd.abs() > c).sum()) / max(upd.numel(), 1)
        else:
            mean = upd.mean(0)
        shared, g = server_step(model, shared, mean, M)
        protos = g if model.uses_prototypes else None
        user, platform = res.user, res.platform
        rec["train_seconds"] = time.perf_counter() - t0
        if (r + 1) % config.eval_every == 0 or r == rounds - 1:
            val = evaluate_platforms(model, shared, user, platform, split.val, user_platform, split.rating_range)
            rec["val"] = val
            if math.isfinite(val["rmse"]) and val["rmse"] < best["rmse"]:
                best.update(round=r, rmse=val["rmse"], state=(shared, user, platform), val=val)
        rec["seconds"] = time.perf_counter() - t0
        if close_round(rec, records, best["round"], shared, rounds, ev, on_round):
            diverged_at = r
            break
    last_round = rounds - 1 if diverged_at is None else diverged_at
    if config.save_global is not None:
        from models.platform_federation import pack_global
        from models.sim.global_state import save_global_state

        final = {k: torch.from_numpy(v) for k, v in pack_global(model, shared, protos).items()}
        save_global_state(final, config.save_global, model=config.model, rounds=last_round + 1, seed=config.seed)
    if best["round"] is None:
        best.update(round=last_round, state=(shared, user, platform), val=None)
    bs, bu, bp = best["state"]
    test = evaluate_platforms(model, bs, bu, bp, split.test, user_platform, split.rating_range)
    seconds_total = time.perf_counter() - t_start
    return _platform_results(
        config, x.name, split, model, rounds=rounds, records=records, best=best, test=test,
        seconds_total=seconds_total, seconds_setup=t_setup, last_round=last_round, diverged_at=diverged_at,
    )


def _platform_results(
    config: PlatformSimConfig,
    dataset: str,
    split: PlatformSplit,
    model: PlatformModel,
    *,
    rounds: int,
    records: list[dict[str, Any]],
    best: Mapping[str, Any],
    test: Mapping[str, float],
    seconds_total: float,
    seconds_setup: float,
    last_round: int,
    diverged_at: int | None,
) -> dict[str, Any]:
    """The results document of a platform-level run (results.json)."""
    from models.laplace_ldp import epsilon_per_release, epsilon_total

    ldp_clip, ldp_scale = config.ldp_clip, config.ldp_scale
    label_dist = split.label_distribution()
    out: dict[str, Any] = {
        "model": config.model,
        "dataset": dataset,
        "seed": config.seed,
        "kind": "explicit",
        "level": "platform",
        "n_users": split.n_users,
        "n_items": split.n_items,
        "n_platforms": split.n_platforms,
        "dirichlet_beta": split.beta,
        "platform_users": np.bincount(split.user_platform, minlength=split.n_platforms).tolist(),
        "platform_train_ratings": split.platform_sizes().tolist(),
        "platform_label_distribution": np.round(label_dist, 4).tolist(),
        "rating_levels": split.levels.tolist(),
        "split_sizes": {"train": len(split.train), "val": len(split.val), "test": len(split.test)},
        "update_dim": model.update_dim,
        "rounds": records,
        "best_round": best["round"],
        "selection": {"metric": "val rmse", "higher_is_better": False},
        "best_val": best.get("val"),
        "test": {k: test[k] for k in ("rmse", "mae", "n_ratings")},
        "seconds_total": seconds_total,
        "seconds_setup": seconds_setup,
        "config": asdict(config) | {"rounds": rounds},
        "model_config": model.config(),
        "protocol": (
            "users with >= 5 ratings; random 80/20 split of the ratings; users on platforms by Dirichlet label "
            "skew; validation = a random 10% of each platform's training ratings; best round by validation RMSE; "
            "test once at the end"
        ),
    }
    if ldp_clip is not None and ldp_scale is not None:
        C, lam = float(ldp_clip), float(ldp_scale)
        out["ldp"] = {
            "mechanism": "Laplace(0, lambda) on every coordinate of an upload clipped to L1 norm C",
            "scale_lambda": lam,
            "l1_clip": C,
            "epsilon_per_release": epsilon_per_release(clip=C, scale=lam),
            "epsilon_total_basic_composition": epsilon_total(clip=C, scale=lam, releases=last_round + 1),
            "releases_per_platform": last_round + 1,
            "meaning": "pure epsilon-DP of each platform's upload under replace-one-platform adjacency "
            "(L1 sensitivity 2C); separate from the Gaussian ledger (models/privacy.py)",
        }
    if diverged_at is not None:
        out["diverged_at_round"] = diverged_at
    return out
