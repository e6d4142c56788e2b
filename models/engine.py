"""The batched federation simulator behind `fedmask simulate`.

One process simulates a whole federation with exactly the per-device functions
an edge client runs (`models/base.py`), stacked over the cohort. Each round:

1. select a cohort (seeded; all devices of the population by default, or
   `clients_per_round` drawn uniformly without replacement); the population
   is every user of the dataset, or `users` (1-based user numbers, like an
   edge client's --users);
2. gather the cohort's private rows (`take_rows`) and training data (`cohort_data`);
3. `model.local_update` -> new private rows and the (B, update_dim) updates;
4. optionally clip every update to L2 norm tau and add N(0, (z tau)^2) noise
   (`models/privacy.py`), on the device side, before aggregation;
5. aggregate: the plain mean, or with `secagg` the real SecAgg(+) protocol run
   in-process (fixed-point encoding, pairwise and self masks, unmasking);
6. `model.apply_mean_update` -> the new global state; scatter the private rows back;
7. every `eval_every` rounds (and after the last) evaluate on *validation*
   (metric sums from `models/evaluation.py`).

Randomness: the initial global state comes from
`keyed_random.global_init_generator(seed)`, exactly like the coordinator's
version 1; every per-device draw (private initialisation, negatives,
mini-batch order) is keyed by (seed, round, user id, ...) inside the models
(`models/keyed_random.py`). So a device trains exactly as it would on an edge
client, whatever the cohort: with the same seed and settings a federation over
gRPC reaches the same global model as `simulate` (up to the secagg
quantisation; tests/integration/test_simulate_equivalence.py). Cohort
sampling and DP noise use their own seeded generators.

Model selection uses validation only: the state (global + all private rows)
of the best validation round is kept (by reference when nothing can mutate
it, copied on write otherwise) and the test metrics are computed once, on that
state, after training. Test numbers never influence anything.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np
import torch

from models.base import (
    CohortData,
    FederatedRecommender,
    GlobalState,
    PrivateState,
    put_rows,
    resolve_device,
    take_cohort,
    take_rows,
)
from models.data.types import ExplicitSplit, ImplicitSplit, Interactions

if TYPE_CHECKING:
    from models.evaluation import Stage
    from models.privacy import Accountant
    from secagg.config import Neighbors, SecAggConfig

MODEL_NAMES: tuple[str, ...] = ("fedrap", "fedmmf", "pfedrec", "fedmf")
IMPLICIT_ONLY = ("fedrap", "pfedrec")


class SimulationConfigError(ValueError):
    """A simulation was asked for something that cannot run (message is user-facing).

    Not to be confused with `secagg.errors.SecAggConfigError` (a secure-aggregation
    configuration that cannot run safely)."""


# ============================================================ models


def build_model(
    name: str,
    *,
    explicit: bool,
    n_users: int,
    n_items: int,
    item_features: np.ndarray | torch.Tensor | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> FederatedRecommender:
    """A model with its tuned defaults (the constructors' defaults), plus `overrides`."""
    kw = dict(overrides or {})
    try:
        if name == "fedrap":
            from models.fedrap import FedRAP

            return FedRAP(n_users, n_items, **kw)
        if name == "pfedrec":
            from models.pfedrec import PFedRec

            return PFedRec(n_users, n_items, **kw)
        if name == "fedmf":
            from models.fedmf import FedMF, FedMFExplicit

            return FedMFExplicit(n_users, n_items, **kw) if explicit else FedMF(n_users, n_items, **kw)
        if name == "fedmmf":
            from models.fedmmf import FedMMF

            feats = None
            if item_features is not None:
                feats = torch.as_tensor(np.asarray(item_features), dtype=torch.float32)
            return FedMMF(n_users, n_items, feats, **kw)
    except TypeError as e:  # an unknown hyperparameter name
        raise SimulationConfigError(f"bad parameter for model {name!r}: {e}") from e
    raise SimulationConfigError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")


def model_is_explicit(name: str, explicit_flag: bool) -> bool:
    if name not in MODEL_NAMES:
        raise SimulationConfigError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    if name == "fedmmf":
        return True
    if explicit_flag and name in IMPLICIT_ONLY:
        raise SimulationConfigError(f"--explicit is only for fedmf (fedmmf is always explicit); {name} is implicit")
    return explicit_flag


def model_config(model: FederatedRecommender) -> dict[str, Any]:
    cfg = getattr(model, "config", None)
    return dict(cfg()) if callable(cfg) else {}


# ============================================================ config and results


@dataclass(frozen=True)
class SimulationConfig:
    model: str
    dataset: str = "ml-100k"
    seed: int = 0
    rounds: int | None = None  # None: the model's tuned default (DEFAULT_ROUNDS)
    clients_per_round: int | None = None  # None: every user, every round
    secagg: bool = False
    secagg_neighbors: int | str | None = None  # SecAgg+ graph degree, or 'all'; None: 'auto' (SecAgg+)
    secagg_clip: float | None = None  # fixed-point range [-c, c]; None: see _secagg_clip
    dp_noise: float | None = None
    dp_clip: float | None = None
    dp_delta: float = 1e-5
    dp_accountant: str = "rdp"
    dp_mode: str = "local"  # local: every device adds N(0,(z tau)^2); distributed: N(0,(z tau)^2 / B)
    device: str = "cpu"
    explicit: bool = False
    eval_every: int = 1
    full_val: bool = False
    threads: int | None = 2
    data_dir: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    users: tuple[int, ...] | None = None  # the population: 1-based user numbers (None: every user)
    save_global: str | None = None  # write the final global state here (.npz, one array per parameter)
    #: FedMMF hybrid rounds (D64): a device whose privacy indicator J is at most
    #: this sends its update UNPROTECTED (plaintext); None (default): all secure.
    plaintext_j_bound: float | None = None

    def __post_init__(self) -> None:
        """Refuse settings that cannot run (SimulationConfigError, user-facing
        message); what needs the data (the population, --clients-per-round)
        or the machine (--device) is checked by `simulate`."""
        if (self.dp_noise is None) != (self.dp_clip is None):
            raise SimulationConfigError("differential privacy needs both --dp-noise Z and --dp-clip TAU")
        if self.dp_noise is not None and self.dp_clip is not None and (self.dp_clip <= 0 or self.dp_noise < 0):
            raise SimulationConfigError("--dp-clip must be > 0 and --dp-noise >= 0")
        if self.rounds is not None and self.rounds < 1:
            raise SimulationConfigError("--rounds must be >= 1")
        if self.dp_mode not in _DP_MODES:
            raise SimulationConfigError(f"--dp-mode must be local or distributed, not {self.dp_mode!r}")
        if self.dp_accountant not in _ACCOUNTANTS:
            raise SimulationConfigError(f"--dp-accountant must be rdp or pld, not {self.dp_accountant!r}")
        if self.dp_mode == "distributed" and self.dp_noise is not None and not self.secagg:
            raise SimulationConfigError(
                "--dp-mode distributed splits the noise across the cohort: only the sum is private, so it needs --secagg"
            )
        if self.secagg_clip is not None and not self.secagg_clip > 0:
            raise SimulationConfigError("--secagg-clip must be > 0")
        if self.eval_every < 1:
            raise SimulationConfigError("--eval-every must be >= 1")
        if self.plaintext_j_bound is not None:
            from models.hybrid import check_bound

            if self.model != "fedmmf":
                raise SimulationConfigError("--plaintext-j-bound is FedMMF's policy (its privacy indicator J): --model fedmmf")
            if self.dp_noise is not None and self.dp_mode == "distributed":
                raise SimulationConfigError(
                    "--plaintext-j-bound cannot be combined with --dp-mode distributed: a plaintext update carries "
                    "only its 1/cohort share of the noise, so no epsilon would cover it"
                )
            try:
                check_bound(self.plaintext_j_bound)
            except ValueError as e:
                raise SimulationConfigError(f"--plaintext-j-bound: {e}") from e

    @property
    def dp(self) -> DPSettings | None:
        """The differential-privacy settings, or None when DP is off."""
        if self.dp_noise is None or self.dp_clip is None:
            return None
        return DPSettings(
            noise=float(self.dp_noise),
            clip=float(self.dp_clip),
            delta=self.dp_delta,
            accountant=_ACCOUNTANTS[self.dp_accountant],
            mode=_DP_MODES[self.dp_mode],
        )

    @property
    def neighbors(self) -> Neighbors:
        """The SecAgg graph: an int degree, 'all' or 'auto' (the default)."""
        n = self.secagg_neighbors
        if n is None:
            return "auto"
        if isinstance(n, int):
            return n
        if n in _GRAPHS:
            return _GRAPHS[n]
        raise SimulationConfigError(f"--secagg: neighbors must be 'all', 'auto' or an int, got {n!r}")


DPMode = Literal["local", "distributed"]
_DP_MODES: dict[str, DPMode] = {"local": "local", "distributed": "distributed"}
_ACCOUNTANTS: dict[str, Accountant] = {"rdp": "rdp", "pld": "pld"}
_GRAPHS: dict[str, Literal["all", "auto"]] = {"all": "all", "auto": "auto"}


@dataclass(frozen=True)
class DPSettings:
    """Differential privacy of a simulation, as checked by SimulationConfig:
    noise multiplier z >= 0, clip norm tau > 0."""

    noise: float
    clip: float
    delta: float
    accountant: Accountant
    mode: DPMode  # local: every device adds N(0,(z tau)^2); distributed: N(0,(z tau)^2 / B)


# rounds of the tuned defaults (docs/tuning.md)
DEFAULT_ROUNDS: dict[str, int] = {"fedrap": 100, "pfedrec": 100, "fedmf": 100, "fedmmf": 150}
DEFAULT_ROUNDS_EXPLICIT_FEDMF = 150


def default_rounds(model: str, explicit: bool) -> int:
    if model == "fedmf" and explicit:
        return DEFAULT_ROUNDS_EXPLICIT_FEDMF
    return DEFAULT_ROUNDS[model]


def _select_key(explicit: bool) -> tuple[str, int]:
    """(metric, sign): the validation metric that picks the best round; sign +1 = higher is better."""
    return ("rmse", -1) if explicit else ("hr@10", +1)


# ============================================================ data


def load_interactions(dataset: str, data_dir: str | None, seed: int) -> Interactions:
    if dataset == "synthetic":
        from models.data.synthetic import synthetic

        return synthetic(seed=seed)
    from models.data.loaders import load_dataset

    try:
        return load_dataset(dataset, data_dir)
    except FileNotFoundError as e:
        raise SimulationConfigError(str(e)) from e


@overload
def make_split(interactions: Interactions, explicit: Literal[False], seed: int) -> ImplicitSplit: ...
@overload
def make_split(interactions: Interactions, explicit: bool, seed: int) -> ImplicitSplit | ExplicitSplit: ...
def make_split(interactions: Interactions, explicit: bool, seed: int) -> ImplicitSplit | ExplicitSplit:
    from models.data.splits import leave_one_out, random_explicit_split

    return random_explicit_split(interactions, seed) if explicit else leave_one_out(interactions, seed)


class _Cohorts:
    """Padded training data of any cohort, cut from one table of the whole
    population (row i = dense user `users[i]`)."""

    def __init__(self, split: ImplicitSplit | ExplicitSplit, users: np.ndarray, device: torch.device) -> None:
        from models.data.sampling import cohort_data, explicit_train_csr

        csr = explicit_train_csr(split) if isinstance(split, ExplicitSplit) else None
        self.all = cohort_data(split, users, device=device, explicit_csr=csr)

    def get(self, rows: torch.Tensor | None) -> CohortData:
        if rows is None:
            return self.all
        return take_cohort(self.all, rows)


# ============================================================ aggregation


class SecureAggregator:
    """Aggregation through the real SecAgg(+) protocol, run in process by
    `secagg.testing.run_round`: every device encodes its update to fixed point,
    runs its own client states (keys, Shamir shares, pairwise and self masks)
    and the server states unmask only the sum. One `SecAggConfig` per cohort
    size, reused across rounds (the round index is bound into every key)."""

    def __init__(self, *, seed: int, neighbors: Neighbors) -> None:
        self.seed = seed
        self.neighbors = neighbors
        self.session_id = f"fedmask-sim-seed-{seed}".encode()
        self._configs: dict[tuple[int, int, float], SecAggConfig] = {}
        self.last: dict[str, Any] = {}

    def config(self, n: int, length: int, clip: float) -> SecAggConfig:
        from secagg import SecAggConfig, SecAggConfigError

        key = (n, length, clip)
        if key not in self._configs:

            def create(neighbors: Neighbors) -> SecAggConfig:
                return SecAggConfig.create(
                    num_clients=n, vector_length=length, session_id=self.session_id, clip=clip, neighbors=neighbors
                )

            try:
                cfg = create(self.neighbors)
            except SecAggConfigError as e:
                if self.neighbors != "auto":
                    raise SimulationConfigError(f"--secagg: {e}") from e
                # too few devices for SecAgg+'s failure targets: the complete graph (Bonawitz)
                cfg = create("all")
            self._configs[key] = cfg
        return self._configs[key]

    def mean(self, updates: torch.Tensor, *, round_idx: int, clip: float) -> torch.Tensor:
        return self.sum(updates, round_idx=round_idx, clip=clip) / updates.shape[0]

    def sum(self, updates: torch.Tensor, *, round_idx: int, clip: float) -> torch.Tensor:
        """The decoded exact sum of the devices' encoded updates (all counted: no dropouts here)."""
        from secagg.testing import run_round

        n, length = updates.shape
        if n < 2:
            raise SimulationConfigError("--secagg needs at least 2 devices per round")
        cfg = self.config(n, length, clip)
        x = updates.detach().to("cpu", torch.float32).numpy()
        # wire=False: in one process the messages are handed over as objects instead of
        # being serialised and parsed; every cryptographic step of every device and of the
        # server still runs (serialisation is ~14 % of a 943-device round and is covered by
        # the secagg tests and `fedmask bench round`, which use the real wire format).
        out = run_round(x, config=cfg, round_idx=round_idx, seed=self.seed * 1_000_003 + round_idx, wire=False)
        if not out.ok or out.sum is None:
            raise RuntimeError(f"secure aggregation aborted in round {round_idx}: {out.abort_reason} {out.abort_detail}")
        self.last = {
            "secagg_graph": cfg.describe(),
            "secagg_counted": len(out.counted),
            "secagg_exact": bool(out.exact),
            "secagg_wall_s": float(out.wall_s),
        }
        return torch.as_tensor(np.asarray(out.sum, dtype=np.float32), device=updates.device)


def _hybrid_mean(
    upd: torch.Tensor,
    J: torch.Tensor,
    config: SimulationConfig,
    secure: SecureAggregator | None,
    round_idx: int,
    rec: dict[str, Any],
) -> torch.Tensor | None:
    """FedMMF's hybrid round (D64): devices with J <= the bound add their
    update in the clear, the others through the secure sum (the in-process
    SecAgg with --secagg, else the plain sum); the mean over the counted
    devices, or None when none is counted. Records how many took each path."""
    from models.hybrid import hybrid_sum, plaintext_choice

    plain = plaintext_choice(J.to(upd.device), config.plaintext_j_bound)

    def secure_sum(rows: torch.Tensor) -> torch.Tensor:
        if secure is None:
            return rows.sum(0)
        c = _secagg_clip(config)
        out = secure.sum(rows, round_idx=round_idx, clip=c)
        rec.update(secure.last)
        rec["secagg_clipped_fraction"] = float((rows.abs() > c).sum()) / rows.numel()
        return out

    h = hybrid_sum(upd, plain, secure_sum)
    rec["plaintext_devices"] = h.plaintext
    rec["secure_devices_chosen"] = h.secure_chosen
    rec["secure_devices_counted"] = h.secure_counted
    return h.mean()


# ============================================================ the simulation


def _generators(seed: int, device: torch.device) -> dict[str, torch.Generator]:
    """Independent seeded streams, so e.g. turning DP on does not change the cohorts.
    (Initialisation and training draws are keyed, see the module doc.)"""
    out = {}
    for i, name in ((1, "cohort"), (3, "dp")):
        g = torch.Generator(device=device)
        g.manual_seed(int(np.random.SeedSequence([seed, i]).generate_state(1)[0]))
        out[name] = g
    return out


def _clone_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in state.items()}


def evaluate_state(
    model: FederatedRecommender,
    global_: GlobalState,
    private: PrivateState,
    split: ImplicitSplit | ExplicitSplit,
    stage: Stage,
    *,
    full: bool,
    placebo: bool,
    device: torch.device,
    population: np.ndarray | None = None,
) -> dict[str, float]:
    """Metrics of the devices of `population` (dense user ids; row i of
    `private` is user population[i]; None: every user, row = user id)."""
    from models.evaluation import evaluate_explicit, evaluate_implicit, finalize

    row_of: torch.Tensor | None = None
    if population is not None:
        row_of = torch.full((split.n_users,), -1, dtype=torch.int64, device=device)
        row_of[torch.as_tensor(population, device=device)] = torch.arange(len(population), device=device)

    def score_fn(users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        rows = users if row_of is None else row_of[users]
        return model.score(global_, take_rows(private, rows), users, items)

    with torch.no_grad():
        if isinstance(split, ImplicitSplit):
            sums = evaluate_implicit(
                score_fn, split, stage, full=full, placebo=placebo, device=device, users=population
            )
        else:
            sums = evaluate_explicit(score_fn, split, stage, device=device, users=population)
    return finalize(sums)


def simulate(
    config: SimulationConfig,
    *,
    interactions: Interactions | None = None,
    progress: bool = False,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run a whole federation; returns the results dict written to results.json."""
    t_start = time.perf_counter()
    explicit = model_is_explicit(config.model, config.explicit)
    device = _resolve_device(config.device)
    if config.threads:
        torch.set_num_threads(config.threads)
    dp = config.dp  # the config checked its own settings when it was made
    rounds = config.rounds if config.rounds is not None else default_rounds(config.model, explicit)

    x = interactions if interactions is not None else load_interactions(config.dataset, config.data_dir, config.seed)
    split = make_split(x, explicit, config.seed)
    n_users, n_items = split.n_users, split.n_items
    population = _population(config.users, n_users, x.name)
    n_pop = len(population)
    pop_arg = None if config.users is None else population  # evaluation over the population only
    cpr = config.clients_per_round
    if cpr is not None and not 1 <= cpr <= n_pop:
        raise SimulationConfigError(f"--clients-per-round must be in [1, {n_pop}] for {x.name}, got {cpr}")
    cohort_size = n_pop if cpr is None else cpr
    full_cohort = cohort_size == n_pop

    model = build_model(
        config.model,
        explicit=explicit,
        n_users=n_users,
        n_items=n_items,
        item_features=split.item_features,
        overrides=config.params,
    )
    from models.keyed_random import global_init_generator

    gens = _generators(config.seed, device)
    cohorts = _Cohorts(split, population, device)
    with torch.no_grad():
        global_ = {k: v.to(device) for k, v in model.init_global(global_init_generator(config.seed)).items()}
        private = model.init_private(cohorts.all, global_, config.seed)

    accountant = None
    if dp is not None and dp.noise > 0:
        from models.privacy import RoundAccountant

        accountant = RoundAccountant(
            noise_multiplier=dp.noise,
            sampling_rate=cohort_size / n_pop,
            delta=dp.delta,
            accountant=dp.accountant,
        )

    secure = SecureAggregator(seed=config.seed, neighbors=config.neighbors) if config.secagg else None
    sel_key, sel_sign = _select_key(explicit)
    best: dict[str, Any] = {"round": None, "value": -math.inf, "global": None, "private": None, "shared": False}
    records: list[dict[str, Any]] = []
    t_setup = time.perf_counter() - t_start

    bar = _Progress(rounds, config.model, sel_key) if progress else None
    try:
        for r in range(rounds):
            t0 = time.perf_counter()
            rows = None
            if not full_cohort:
                perm = torch.randperm(n_pop, generator=gens["cohort"], device=gens["cohort"].device)
                rows = perm[:cohort_size].sort().values.to(device)
            data = cohorts.get(rows)
            priv_c = private if rows is None else take_rows(private, rows)
            with torch.no_grad():
                new_priv, upd = model.local_update(global_, priv_c, data, r, config.seed)
            rec: dict[str, Any] = {"round": r}
            if upd.shape != (data.users.shape[0], model.update_dim):
                raise RuntimeError(f"{model.name}.local_update returned updates of shape {tuple(upd.shape)}")
            if dp is not None and upd.shape[1] > 0:
                from models.privacy import privatize

                z = dp.noise
                if dp.mode == "distributed":  # each device 1/B of the variance: the sum gets N(0, (z tau)^2)
                    z = z / math.sqrt(upd.shape[0])
                upd, norms = privatize(upd, clip=dp.clip, noise_multiplier=z, generator=gens["dp"])
                rec["update_norm_mean"] = float(norms.mean())
                rec["clipped_fraction"] = float((norms > dp.clip).float().mean())
            if accountant is not None:
                accountant.step()
            mean: torch.Tensor | None
            if upd.shape[1] == 0:
                mean = upd.new_zeros(0)
            elif config.plaintext_j_bound is not None:
                mean = _hybrid_mean(upd, priv_c["J"], config, secure, r, rec)
            elif secure is not None:
                c = _secagg_clip(config)
                mean = secure.mean(upd, round_idx=r, clip=c)
                rec.update(secure.last)
                rec["secagg_clipped_fraction"] = float((upd.abs() > c).sum()) / upd.numel()
            else:
                mean = upd.mean(0)
            if mean is not None:  # None: no device counted (a hybrid round with too few of either kind)
                global_ = model.apply_mean_update(global_, mean, r)
            if rows is None:
                private = new_priv
            else:
                if best["shared"]:  # copy-on-write: the kept best state must not change
                    best["private"] = _clone_state(best["private"])
                    best["shared"] = False
                put_rows(private, rows, new_priv)
            del upd, new_priv, priv_c
            rec["train_seconds"] = time.perf_counter() - t0

            t1 = time.perf_counter()
            if (r + 1) % config.eval_every == 0 or r == rounds - 1:
                val = evaluate_state(
                    model, global_, private, split, "val", full=config.full_val, placebo=False, device=device,
                    population=pop_arg,
                )
                rec["val"] = val
                v = sel_sign * val.get(sel_key, math.nan)
                if math.isfinite(v) and v > best["value"]:
                    best.update(round=r, value=v)
                    best["global"] = global_  # new tensors every round: safe by reference
                    best["private"] = private
                    best["shared"] = True
            rec["eval_seconds"] = time.perf_counter() - t1
            summary = getattr(model, "summary", None)  # e.g. FedRAP's sparsity of C
            if callable(summary):
                rec.update(summary(global_, private))
            rec["seconds"] = time.perf_counter() - t0
            records.append(rec)
            if bar is not None:
                bar.advance(rec, best)
            if on_round is not None:
                on_round(rec)
    finally:
        if bar is not None:
            bar.close()

    t_train_end = time.perf_counter()
    saved_global = None
    if config.save_global is not None:
        saved_global = str(save_global_state(global_, config.save_global, round_=rounds - 1, seed=config.seed))
    if best["round"] is None:  # every validation value was NaN: fall back to the last round
        best["round"] = rounds - 1
        best["global"], best["private"] = global_, private
    test = evaluate_state(
        model, best["global"], best["private"], split, "test", full=True, placebo=True, device=device,
        population=pop_arg,
    )
    summary_fn = getattr(model, "summary", None)
    summary_best = summary_fn(best["global"], best["private"]) if callable(summary_fn) else {}
    seconds_total = time.perf_counter() - t_start

    out: dict[str, Any] = {
        "model": config.model,
        "dataset": x.name,
        "seed": config.seed,
        "kind": "explicit" if explicit else "implicit",
        "n_users": n_users,
        "n_items": n_items,
        "cohort_size": cohort_size,
        "population": n_pop,
        "update_dim": model.update_dim,
        "rounds": records,
        "best_round": best["round"],
        "selection": {"metric": f"val {sel_key}", "higher_is_better": sel_sign > 0},
        "best_val": next(rec["val"] for rec in records if rec["round"] == best["round"] and "val" in rec)
        if any("val" in rec and rec["round"] == best["round"] for rec in records)
        else None,
        "test": _test_block(test, explicit),
        "summary": summary_best,
        "seconds_total": seconds_total,
        "seconds_setup": t_setup,
        "seconds_training": t_train_end - t_start - t_setup,
        "config": asdict(config) | {"rounds": rounds},
        "model_config": model_config(model),
        "protocol": _protocol_note(explicit),
    }
    if saved_global is not None:
        out["saved_global"] = saved_global
    if config.plaintext_j_bound is not None:
        plain = sum(rec.get("plaintext_devices", 0) for rec in records)
        chosen = sum(rec.get("secure_devices_chosen", 0) for rec in records)
        counted_sec = sum(rec.get("secure_devices_counted", 0) for rec in records)
        out["hybrid"] = {
            "plaintext_j_bound": config.plaintext_j_bound,
            "plaintext_share": plain / max(plain + chosen, 1),
            "plaintext_contributions": plain,
            "secure_contributions": counted_sec,
            "secure_sat_out": chosen - counted_sec,
            "meaning": "plaintext contributions are UNPROTECTED: the server sees each such device's item-factor "
            "update (D64-D66); no epsilon or secure-aggregation guarantee covers them",
        }
    if not explicit:
        out["placebo"] = {"hr@10": test.get("placebo_hr@10", math.nan), "ndcg@10": test.get("placebo_ndcg@10", math.nan)}
    if dp is not None:
        out["dp"] = {
            "noise_multiplier": config.dp_noise,
            "clip": config.dp_clip,
            "delta": config.dp_delta,
            "accountant": config.dp_accountant,
            "mode": config.dp_mode,
            "sampling_rate": cohort_size / n_pop,
            "rounds": rounds,
            "meaning": (
                "user-level (add/remove one device) epsilon of the Poisson-subsampled Gaussian mechanism "
                "with noise multiplier z and sampling rate q = cohort/population, composed over all rounds "
                "(dp_accounting), for what the aggregated updates reveal; "
                + (
                    "local noise: conservative for the aggregate (it carries noise z*tau*sqrt(B))"
                    if config.dp_mode == "local"
                    else "distributed noise: exact for the sum seen through secure aggregation, "
                    "assuming the devices add their share"
                )
                + "; see models/privacy.py"
            ),
        }
        out["epsilon"] = accountant.epsilon() if accountant is not None else math.inf
    return out


def _population(users: tuple[int, ...] | None, n_users: int, name: str) -> np.ndarray:
    """Dense user ids (sorted) of the simulated devices; `users` are 1-based numbers."""
    if users is None:
        return np.arange(n_users, dtype=np.int64)
    pop = np.array(sorted(int(u) - 1 for u in users), dtype=np.int64)
    if len(pop) == 0:
        raise SimulationConfigError("--users selects no device")
    if len(np.unique(pop)) != len(pop):
        raise SimulationConfigError("--users lists a user twice")
    if pop[0] < 0 or pop[-1] >= n_users:
        raise SimulationConfigError(f"--users must lie in 1..{n_users} for {name}")
    return pop


def save_global_state(global_: GlobalState, path: str | Path, **meta: Any) -> Path:
    """Write a global state as an .npz of float32 arrays (one per parameter,
    by name) plus `__meta__` (JSON); returns the path."""
    import json

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    arrays = {k: v.detach().to("cpu", torch.float32).numpy() for k, v in global_.items()}
    with open(p, "wb") as f:  # np.savez would append .npz to a name without it
        # allow_pickle named (its default) so that no array can be taken for it
        np.savez(f, allow_pickle=True, **arrays, __meta__=np.array(json.dumps(meta)))
    return p


def load_global_state(path: str | Path) -> dict[str, np.ndarray]:
    """The arrays of `save_global_state` (without the metadata)."""
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files if k != "__meta__"}


def _test_block(test: Mapping[str, float], explicit: bool) -> dict[str, float]:
    keys = ("rmse", "mae", "n_ratings") if explicit else ("hr@10", "ndcg@10", "full_hr@10", "full_ndcg@10", "n_users")
    return {k: float(test[k]) for k in keys if k in test}


def _protocol_note(explicit: bool) -> str:
    if explicit:
        return "per-user random split 72/8/20 (train/val/test); best round by validation RMSE; test once at the end"
    return (
        "leave-one-out by time; training negatives drawn every epoch from all items minus the user's training "
        "items; best round by validation HR@10 (99 sampled negatives); test once at the end on the kept state"
    )


SECAGG_DEFAULT_CLIP = 32.0


def _secagg_clip(config: SimulationConfig) -> float:
    """The fixed-point range [-c, c] every device encodes its update in (a public,
    agreed constant): --secagg-clip if given; with DP, tau * (1 + 6 z) (a clipped
    coordinate is at most tau, the noise rarely exceeds 6 std); otherwise 32,
    above every coordinate the tuned models produce (the encoding clips the rare
    larger one; the run records how many were)."""
    if config.secagg_clip is not None:
        return float(config.secagg_clip)
    if config.dp_clip is not None:
        return float(config.dp_clip) * (1.0 + 6.0 * float(config.dp_noise or 0.0))
    return SECAGG_DEFAULT_CLIP


def _resolve_device(name: str) -> torch.device:
    try:
        return resolve_device(name)
    except ValueError as e:
        raise SimulationConfigError(str(e)) from None


class _Progress:
    """Rounds progress with the current validation metric: a rich bar on a
    terminal, a plain line now and then when stderr is a file or a pipe
    (models/progress.py)."""

    def __init__(self, rounds: int, model: str, metric: str) -> None:
        from models.progress import Progress

        self.metric = metric
        self.p = Progress(f"{model} rounds", rounds, unit="rounds")

    def advance(self, rec: Mapping[str, Any], best: Mapping[str, Any]) -> None:
        val = rec.get("val")
        status = None
        if val is not None:
            v = val.get(self.metric, math.nan)
            status = f"val {self.metric} {v:.4f} (best round {best['round']})"
        self.p.advance(status=status)

    def close(self) -> None:
        self.p.close()


def write_results(results: Mapping[str, Any], out_dir: str | Path) -> tuple[Path, Path]:
    """Write DIR/results.json and DIR/metrics.png; returns their paths."""
    from models.results import plot_metrics, save_json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    j = save_json(results, out / "results.json")
    p = plot_metrics(results, out / "metrics.png")
    return j, p
