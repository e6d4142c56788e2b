"""The trainer adapter: local data, private state and local training of the
hosted devices, with exactly the functions the simulation engine uses.

All devices selected in a round train together, as one cohort, like the
engine does (`models/engine.py`): their private rows are loaded from the
state store and stacked (`stack_rows`, the on-disk counterpart of
`take_rows`), their local data padded into one `CohortData`,
`model.local_update` runs once for the batch, updates are clipped and noised
per row (`models.privacy.clip_rows` / `add_gaussian_noise`), and the new
private rows are written back per device (atomically, before the device
advertises keys). There is no per-device Python loop around training.

Local data: on the first start each hosted device's part of the dataset is
cut out (the same seeded `leave_one_out` and `random_explicit_split` the
simulation uses, so numbers are comparable) and persisted in its state dir;
later starts read it from there. Each device keeps both forms (implicit and
explicit); the round's model decides which one trains.

Randomness: private-state initialisation, training negatives and mini-batch
orders are keyed draws (`models/keyed_random.py`): pure functions of
(--seed, the task's round_idx, the device's user id, purpose, index), so a
device trains exactly as in `fedmask simulate --seed S` whichever devices
share its process or batch. DP noise and the stochastic rounding of the
secagg encoding always come from os.urandom (a seeded noise would let anyone
who knows the seed subtract it).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edge_client.state import DeviceStore, read_arrays, write_arrays
from models.base import CohortData, FederatedRecommender, GlobalState, PrivateState

log = logging.getLogger("edge_client.trainer")

SYNTHETIC_MODEL = "synthetic"
# hyperparameters_json keys that are not model constructor arguments
_NON_MODEL_KEYS = frozenset(
    {"round_idx", "local_round", "curriculum_round", "explicit", "seed", "scale", "vector_length", "dataset", "n_users", "n_items"}
)
_DATA_VERSION = 1


class TrainingError(Exception):
    """The round cannot be trained on this client; `reason` is a proto AbortReason name suffix."""

    def __init__(self, message: str, reason: str = "client_error") -> None:
        super().__init__(message)
        self.reason = reason


class DatasetError(ValueError):
    """Unknown or unreadable dataset (user-facing message)."""


# ============================================================ hosted devices


@dataclass(frozen=True)
class HostedDevice:
    """One device of this process: user `number` (1-based) of the dataset."""

    number: int
    store: DeviceStore

    @property
    def user(self) -> int:
        """Dense user id (0-based) in the dataset."""
        return self.number - 1

    @property
    def local_id(self) -> str:
        return self.store.local_id


def local_id_of(number: int) -> str:
    return f"user-{number}"


# ============================================================ data


def load_interactions(dataset: str, data_dir: str | None, seed: int):
    """The dataset as `models.data.types.Interactions` (same loader as `fedmask simulate`)."""
    from models.engine import ConfigError, load_interactions as _load

    try:
        return _load(dataset, data_dir, seed)
    except ConfigError as e:
        raise DatasetError(f"unknown or missing dataset {dataset!r}: {e}") from None
    except (ValueError, OSError) as e:
        raise DatasetError(f"cannot load dataset {dataset!r}: {e}") from None


@dataclass
class LocalSplits:
    """The stacked local data of some devices, as mini splits whose row b is device b."""

    implicit: Any  # ImplicitSplit with n_users = B
    explicit: Any  # ExplicitSplit with n_users = B
    users: np.ndarray  # dense user ids (B,)


def _device_arrays(imp, exp, user: int) -> dict[str, np.ndarray]:
    """Device `user`'s rows of the two full-dataset splits."""
    a, b = imp.train_indptr[user], imp.train_indptr[user + 1]
    e_tr = exp.train_user == user
    e_va = exp.val_user == user
    e_te = exp.test_user == user
    return {
        "imp_train": imp.train_items[a:b].astype(np.int64),
        "imp_heldout": np.array([imp.val_item[user], imp.test_item[user], imp.placebo_item[user]], dtype=np.int64),
        "imp_val_neg": imp.val_negatives[user].astype(np.int64),
        "imp_test_neg": imp.test_negatives[user].astype(np.int64),
        "exp_train_items": exp.train_item[e_tr].astype(np.int64),
        "exp_train_ratings": exp.train_rating[e_tr].astype(np.float32),
        "exp_val_items": exp.val_item[e_va].astype(np.int64),
        "exp_val_ratings": exp.val_rating[e_va].astype(np.float32),
        "exp_test_items": exp.test_item[e_te].astype(np.int64),
        "exp_test_ratings": exp.test_rating[e_te].astype(np.float32),
    }


def _stack_splits(parts: Sequence[Mapping[str, np.ndarray]], n_items: int, rating_range, item_features) -> tuple:
    from models.data.types import ExplicitSplit, ImplicitSplit

    B = len(parts)
    lens = np.array([len(p["imp_train"]) for p in parts], dtype=np.int64)
    indptr = np.zeros(B + 1, dtype=np.int64)
    np.cumsum(lens, out=indptr[1:])
    held = np.stack([p["imp_heldout"] for p in parts]) if B else np.zeros((0, 3), np.int64)
    imp = ImplicitSplit(
        n_users=B,
        n_items=n_items,
        train_indptr=indptr,
        train_items=np.concatenate([p["imp_train"] for p in parts]) if B else np.zeros(0, np.int64),
        val_item=held[:, 0].copy(),
        test_item=held[:, 1].copy(),
        val_negatives=np.stack([p["imp_val_neg"] for p in parts]) if B else np.zeros((0, 99), np.int64),
        test_negatives=np.stack([p["imp_test_neg"] for p in parts]) if B else np.zeros((0, 99), np.int64),
        placebo_item=held[:, 2].copy(),
        seed=0,
        item_features=item_features,
    )

    def cat(key: str, dtype) -> np.ndarray:
        return np.concatenate([p[key] for p in parts]).astype(dtype) if B else np.zeros(0, dtype)

    def rows(key: str) -> np.ndarray:
        return np.concatenate([np.full(len(p[key]), b, dtype=np.int64) for b, p in enumerate(parts)]) if B else np.zeros(0, np.int64)

    exp = ExplicitSplit(
        n_users=B,
        n_items=n_items,
        train_user=rows("exp_train_items"),
        train_item=cat("exp_train_items", np.int64),
        train_rating=cat("exp_train_ratings", np.float32),
        val_user=rows("exp_val_items"),
        val_item=cat("exp_val_items", np.int64),
        val_rating=cat("exp_val_ratings", np.float32),
        test_user=rows("exp_test_items"),
        test_item=cat("exp_test_items", np.int64),
        test_rating=cat("exp_test_ratings", np.float32),
        seed=0,
        item_features=item_features,
        rating_range=tuple(rating_range),
    )
    return imp, exp


# ============================================================ the trainer


@dataclass(frozen=True)
class TaskSpec:
    """What training needs from a RoundTask (decoded by the session driver)."""

    model_name: str
    model_version: int
    round_number: int
    round_idx: int  # the model's round counter (curriculum)
    hyperparameters: Mapping[str, Any]
    global_params: Mapping[str, np.ndarray]
    vector_length: int
    dp_mode: str = "none"  # none | local | distributed
    dp_clip_norm: float = 0.0
    dp_noise_stddev: float = 0.0


@dataclass
class TrainOutput:
    """The privatised updates of a trained batch (row b = the b-th device
    asked for) and each row's metric sums, to report any subset of its rows
    (`metrics(rows)`)."""

    updates: np.ndarray  # float64 (B, L): clipped + noised, ready to encode
    examples: np.ndarray | None = None  # int64 (B,) training positives / ratings
    norms: np.ndarray | None = None  # float64 (B,) pre-clipping L2 norms
    clip_norm: float | None = None
    seconds: float = 0.0
    val_rows: list[dict[str, float]] | None = field(default=None, repr=False)  # per row, models/evaluation sums

    def metrics(self, rows: Sequence[int]) -> tuple[dict[str, float], dict[str, int]]:
        """(sums, counts) over `rows` only (see docs/wire-notes.md for the names)."""
        rows = [int(r) for r in rows]
        sums: dict[str, float] = {}
        counts: dict[str, int] = {"devices": len(rows)}
        if self.examples is not None:
            counts["examples"] = int(self.examples[rows].sum()) if rows else 0
        if self.norms is not None and len(self.norms):
            sums["update_norm"] = float(self.norms[rows].sum()) if rows else 0.0
            if self.clip_norm is not None:
                sums["clipped"] = float((self.norms[rows] > self.clip_norm).sum()) if rows else 0.0
        if self.val_rows is not None and rows:
            from models.evaluation import merge_sums

            for key, value in merge_sums(self.val_rows[r] for r in rows).items():
                if key.endswith("_count"):
                    counts["val_" + key] = int(value)
                else:
                    sums["val_" + key] = float(value)
        return sums, counts


@dataclass
class _ModelEntry:
    model: FederatedRecommender
    explicit: bool
    global_shapes: dict[str, tuple[int, ...]]
    private_shapes: dict[str, tuple[int, ...]] | None = None


class Trainer:
    """Local training and queries for the hosted devices of one process."""

    def __init__(
        self,
        interactions: Any,
        devices: Sequence[HostedDevice],
        *,
        split_seed: int = 0,
        seed: int = 0,
        torch_device: str = "cpu",
        global_path: os.PathLike[str] | str | None = None,
        secure_random=os.urandom,
    ) -> None:
        self.x = interactions
        self.n_users, self.n_items = int(interactions.n_users), int(interactions.n_items)
        self.devices = {d.number: d for d in devices}
        self.split_seed = split_seed
        self.seed = seed
        self.device = _resolve_device(torch_device)
        self.global_path = None if global_path is None else os.fspath(global_path)
        self.secure_random = secure_random
        self._models: dict[str, _ModelEntry] = {}
        self._local: dict[int, dict[str, np.ndarray]] = {}
        self._seen: dict[int, np.ndarray] = {}

    # ------------------------------------------------------------ local data
    def prepare_local_data(self) -> int:
        """Load every hosted device's local split, creating and persisting the
        missing ones; returns how many were created."""
        missing = []
        for number, d in self.devices.items():
            got = d.store.load_data()
            if got is None:
                missing.append(number)
                continue
            arrays, meta = got
            if meta.get("version") != _DATA_VERSION or meta.get("n_items") != self.n_items or meta.get("user") != d.user:
                raise DatasetError(
                    f"state of {d.local_id} was made for another dataset or layout "
                    f"(n_items {meta.get('n_items')}, user {meta.get('user')}); use another --state-dir"
                )
            self._local[number] = arrays
        if missing:
            from models.data.splits import leave_one_out, random_explicit_split

            imp = leave_one_out(self.x, self.split_seed)
            exp = random_explicit_split(self.x, self.split_seed)
            for number in missing:
                d = self.devices[number]
                arrays = _device_arrays(imp, exp, d.user)
                d.store.save_data(
                    arrays,
                    {
                        "version": _DATA_VERSION,
                        "dataset": self.x.name,
                        "n_items": self.n_items,
                        "user": d.user,
                        "split_seed": self.split_seed,
                        "rating_range": list(exp.rating_range),
                    },
                )
                self._local[number] = arrays
        for number, arrays in self._local.items():
            self._seen[number] = np.unique(
                np.concatenate([arrays["imp_train"], arrays["imp_heldout"][:2][arrays["imp_heldout"][:2] >= 0],
                                arrays["exp_train_items"], arrays["exp_val_items"], arrays["exp_test_items"]])
            )
        return len(missing)

    def _rating_range(self) -> tuple[float, float]:
        r = self.x.rating
        return (float(r.min()), float(r.max())) if len(r) else (1.0, 5.0)

    def splits(self, numbers: Sequence[int]) -> LocalSplits:
        parts = [self._local[n] for n in numbers]
        imp, exp = _stack_splits(parts, self.n_items, self._rating_range(), self.x.item_features)
        return LocalSplits(imp, exp, np.array([self.devices[n].user for n in numbers], dtype=np.int64))

    def cohort(self, numbers: Sequence[int], explicit: bool) -> tuple[CohortData, Any]:
        """The padded training data of `numbers` (row b = device b) and its mini split."""
        from models.data.sampling import cohort_data

        s = self.splits(numbers)
        split = s.explicit if explicit else s.implicit
        data = cohort_data(split, np.arange(len(numbers)), device=self.device)
        return replace(data, users=torch.from_numpy(s.users.copy()).to(self.device)), split

    # ------------------------------------------------------------ models
    def model_for(self, name: str, hyper: Mapping[str, Any]) -> _ModelEntry:
        from models.engine import ConfigError, build_model

        if "n_items" in hyper and hyper["n_items"] != self.n_items:
            raise TrainingError(
                f"the federation's model has n_items={hyper['n_items']}, this client's dataset "
                f"{self.x.name} has {self.n_items}",
                "model_mismatch",
            )
        params = {k: v for k, v in hyper.items() if k not in _NON_MODEL_KEYS}
        explicit = name == "fedmmf" or bool(hyper.get("explicit", False))
        key = json.dumps([name, explicit, params], sort_keys=True, default=str)
        entry = self._models.get(key)
        if entry is None:
            try:
                model = build_model(
                    name,
                    explicit=explicit,
                    n_users=self.n_users,
                    n_items=self.n_items,
                    item_features=self.x.item_features,
                    overrides=params,
                )
            except (ConfigError, ValueError) as e:
                raise TrainingError(f"cannot build model {name!r}: {e}", "model_mismatch") from None
            g = torch.Generator(device=self.device).manual_seed(0)
            with torch.no_grad():
                shapes = {k: tuple(v.shape) for k, v in model.init_global(g).items()}
            entry = _ModelEntry(model, explicit, shapes)
            self._models[key] = entry
        return entry

    def _globals(self, entry: _ModelEntry, params: Mapping[str, np.ndarray], name: str) -> GlobalState:
        got = {k: tuple(np.shape(v)) for k, v in params.items()}
        if got != entry.global_shapes:
            raise TrainingError(
                f"global parameters of {name} do not fit this client's dataset "
                f"({self.x.name}: {self.n_items} items): got {got}, expected {entry.global_shapes}",
                "model_mismatch",
            )
        return {k: torch.from_numpy(np.array(v, dtype=np.float32)).to(self.device) for k, v in params.items()}

    def _secure_generator(self) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(int.from_bytes(self.secure_random(8), "little") >> 1)

    def secure_numpy_rng(self) -> np.random.Generator:
        """For stochastic rounding of the encoding (never seeded from --seed)."""
        return np.random.default_rng(int.from_bytes(self.secure_random(16), "little"))

    # ------------------------------------------------------------ private state
    def _load_private(
        self, entry: _ModelEntry, name: str, numbers: Sequence[int], data: CohortData, global_: GlobalState
    ) -> PrivateState:
        """Stack the devices' stored private rows; initialise the missing ones
        (all of them in one `init_private` call, like the engine)."""
        if entry.private_shapes is None:  # the model's row shapes, from a one-device template
            with torch.no_grad():
                tmpl = entry.model.init_private(
                    _take_cohort(data, torch.zeros(1, dtype=torch.int64, device=self.device)),
                    global_,
                    self.seed,
                )
            entry.private_shapes = {k: tuple(v.shape[1:]) for k, v in tmpl.items()}
        rows: dict[int, dict[str, np.ndarray]] = {}
        for n in numbers:
            got = self.devices[n].store.load_model(name)
            if got is None:
                continue
            arrays, _meta = got
            if {k: tuple(v.shape) for k, v in arrays.items()} != entry.private_shapes:
                log.warning("%s: stored %s state has other shapes (hyperparameters changed?); re-initialising",
                            self.devices[n].local_id, name)
                continue
            rows[n] = arrays
        missing = [i for i, n in enumerate(numbers) if n not in rows]
        fresh: PrivateState | None = None
        if missing:
            idx = torch.tensor(missing, dtype=torch.int64, device=self.device)
            with torch.no_grad():
                fresh = entry.model.init_private(_take_cohort(data, idx), global_, self.seed)
        keys = list(entry.private_shapes)
        out: PrivateState = {}
        pos = {i: j for j, i in enumerate(missing)}
        for k in keys:
            parts = []
            for i, n in enumerate(numbers):
                if n in rows:
                    parts.append(torch.as_tensor(rows[n][k]).to(self.device))
                else:
                    assert fresh is not None
                    parts.append(fresh[k][pos[i]])
            out[k] = torch.stack(parts)
        return out

    def save_private(
        self, name: str, numbers: Sequence[int], private: PrivateState, *, model_version: int, round_number: int
    ) -> None:
        """Write each device's new private rows (atomically, one file per device)."""
        host = {k: v.detach().to("cpu").numpy() for k, v in private.items()}
        for i, n in enumerate(numbers):
            self.devices[n].store.save_model(
                name,
                {k: np.array(v[i], copy=True) for k, v in host.items()},
                {"model_version": int(model_version), "round_number": int(round_number), "saved_at": time.time()},
            )

    # ------------------------------------------------------------ training
    def train(self, task: TaskSpec, numbers: Sequence[int]) -> TrainOutput:
        """Train the devices `numbers` together; persist their new private
        state; return their privatised updates and metric sums."""
        t0 = time.perf_counter()
        if task.model_name == SYNTHETIC_MODEL:
            raise TrainingError("synthetic rounds do not train; use synthetic_updates", "client_error")
        entry = self.model_for(task.model_name, task.hyperparameters)
        model = entry.model
        if model.update_dim != task.vector_length:
            raise TrainingError(
                f"{task.model_name} on {self.x.name} has update_dim {model.update_dim}, the round expects "
                f"vector_length {task.vector_length}",
                "model_mismatch",
            )
        global_ = self._globals(entry, task.global_params, task.model_name)
        self.remember_global(task)
        data, split = self.cohort(numbers, entry.explicit)
        private = self._load_private(entry, task.model_name, numbers, data, global_)
        with torch.no_grad():
            new_private, upd = model.local_update(global_, private, data, task.round_idx, self.seed)
        B = len(numbers)
        if tuple(upd.shape) != (B, model.update_dim):
            raise TrainingError(f"{task.model_name}.local_update returned shape {tuple(upd.shape)}")
        norms = torch.linalg.vector_norm(upd, dim=1) if upd.shape[1] > 0 else None
        clip_norm = None
        if task.dp_mode in ("local", "distributed") and upd.shape[1] > 0:
            from models.privacy import add_gaussian_noise, clip_rows

            if task.dp_clip_norm > 0:
                upd, norms = clip_rows(upd, clip=task.dp_clip_norm)
                clip_norm = task.dp_clip_norm
            if task.dp_noise_stddev > 0:
                upd = add_gaussian_noise(upd, std=task.dp_noise_stddev, generator=self._secure_generator())
        if not bool(torch.isfinite(upd).all()):
            raise TrainingError("local training produced a non-finite update")
        self.save_private(task.model_name, numbers, new_private,
                          model_version=task.model_version, round_number=task.round_number)

        # each device's own validation sums, now, so that RoundMetrics can go
        # right after the last MaskedInput for whichever devices sent one
        val_rows = [
            self._validation_sums(model, global_, new_private, split, entry.explicit, numbers, [b]) for b in range(B)
        ]
        return TrainOutput(
            updates=upd.detach().to("cpu", torch.float64).numpy(),
            examples=data.lengths.detach().to("cpu").numpy().astype(np.int64),
            norms=None if norms is None else norms.detach().to("cpu", torch.float64).numpy(),
            clip_norm=clip_norm,
            seconds=time.perf_counter() - t0,
            val_rows=val_rows,
        )

    def _validation_sums(self, model, global_, private, split, explicit, numbers, rows) -> dict[str, float]:
        """Validation sums of the batch rows `rows` (models/evaluation.py), scored with
        each device's new private state and the round's global parameters."""
        from models.base import take_rows
        from models.evaluation import evaluate

        users = torch.as_tensor(np.array([self.devices[n].user for n in numbers]), device=self.device)

        def score_fn(rows: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
            rows = rows.to(self.device)
            return model.score(global_, take_rows(private, rows), users.index_select(0, rows), items)

        with torch.no_grad():
            sel = np.asarray(rows, dtype=np.int64)
            if explicit:
                return evaluate(score_fn, split, "val", users=sel, device=self.device)
            return evaluate(score_fn, split, "val", users=sel, full=False, placebo=False, device=self.device)

    # ------------------------------------------------------------ synthetic
    def synthetic_updates(self, task: TaskSpec, device_ids: Sequence[int], *, clip: float) -> TrainOutput:
        return TrainOutput(
            updates=synthetic_updates(
                device_ids, round_number=task.round_number, vector_length=task.vector_length,
                seed=int(task.hyperparameters.get("seed", self.seed)),
                scale=float(task.hyperparameters.get("scale", clip)),
            ),
        )

    # ------------------------------------------------------------ global state and top-k
    def remember_global(self, task: TaskSpec) -> None:
        """Keep the latest global parameters (public) for top-k queries after training."""
        self._latest = task
        if self.global_path is None:
            return
        write_arrays(
            _path(self.global_path),
            {f"g_{k}": np.asarray(v, dtype=np.float32) for k, v in task.global_params.items()},
            {
                "kind": "global",
                "model": task.model_name,
                "model_version": int(task.model_version),
                "round_number": int(task.round_number),
                "hyperparameters": dict(task.hyperparameters),
            },
        )

    def latest_global(self) -> TaskSpec | None:
        latest = getattr(self, "_latest", None)
        if latest is not None or self.global_path is None:
            return latest
        got = read_arrays(_path(self.global_path))
        if got is None:
            return None
        arrays, meta = got
        self._latest = TaskSpec(
            model_name=str(meta["model"]),
            model_version=int(meta["model_version"]),
            round_number=int(meta["round_number"]),
            round_idx=0,
            hyperparameters=dict(meta.get("hyperparameters", {})),
            global_params={k[2:]: v for k, v in arrays.items() if k.startswith("g_")},
            vector_length=0,
        )
        return self._latest

    def top_k(self, number: int, k: int, *, exclude_seen: bool) -> tuple[list[int], list[float], int]:
        """(item ids, scores descending, global model version) for device `number`,
        scored on the device over all items with model.score."""
        if number not in self.devices:
            raise KeyError(number)
        if k < 1:
            raise ValueError("k must be >= 1")
        latest = self.latest_global()
        if latest is None or latest.model_name == SYNTHETIC_MODEL:
            raise LookupError("no trained model on this device yet")
        entry = self.model_for(latest.model_name, latest.hyperparameters)
        global_ = self._globals(entry, latest.global_params, latest.model_name)
        got = self.devices[number].store.load_model(latest.model_name)
        if got is None:
            raise LookupError(f"device has not trained {latest.model_name} yet")
        arrays, _meta = got
        private = {key: torch.as_tensor(v).unsqueeze(0).to(self.device) for key, v in arrays.items()}
        items = torch.arange(self.n_items, device=self.device).unsqueeze(0)
        users = torch.tensor([self.devices[number].user], device=self.device)
        with torch.no_grad():
            scores = entry.model.score(global_, private, users, items)[0].to(torch.float32)
        scores = torch.nan_to_num(scores, nan=-math.inf)
        if exclude_seen:
            seen = self._seen.get(number)
            if seen is not None and len(seen):
                scores[torch.as_tensor(seen, device=scores.device)] = -math.inf
        avail = int(torch.isfinite(scores).sum())
        kk = min(k, avail)
        if kk == 0:
            return [], [], int(latest.model_version)
        top = torch.topk(scores, kk)
        return (
            [int(i) for i in top.indices.cpu()],
            [float(s) for s in top.values.cpu()],
            int(latest.model_version),
        )


def synthetic_updates(
    device_ids: Sequence[int], *, round_number: int, vector_length: int, seed: int, scale: float
) -> np.ndarray:
    """The benchmark's stand-in for training: device d's update in round r is
    `np.random.default_rng([seed, r, d]).uniform(-scale, scale, L)` (float64),
    so a test can recompute the expected aggregate from the ids alone."""
    out = np.empty((len(device_ids), vector_length), dtype=np.float64)
    for i, d in enumerate(device_ids):
        out[i] = np.random.default_rng([int(seed), int(round_number), int(d)]).uniform(
            -scale, scale, vector_length
        )
    return out


def _take_cohort(data: CohortData, rows: torch.Tensor) -> CohortData:
    lengths = data.lengths.index_select(0, rows)
    lmax = int(lengths.max()) if rows.numel() else 0
    return CohortData(
        users=data.users.index_select(0, rows),
        items=data.items.index_select(0, rows)[:, :lmax],
        mask=data.mask.index_select(0, rows)[:, :lmax],
        lengths=lengths,
        ratings=None if data.ratings is None else data.ratings.index_select(0, rows)[:, :lmax],
    )


def _path(p: str) -> Path:
    return Path(p)


def _resolve_device(name: str) -> torch.device:
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise DatasetError(f"--device {name} requested but CUDA is not available on this machine")
        return torch.device(name)
    raise DatasetError(f"unknown --device {name!r}; use cpu or cuda")

