"""The trainer: local training of a batch of hosted devices, with exactly
the functions the simulation engine uses.

All devices selected in a round train together, as one cohort, like the
engine does (`models/sim/engine.py`): their local data is stacked
(`edge_client.local_data`) and padded into one `CohortData`, their private
rows are loaded from the state store and stacked, `model.local_update` runs
once for the batch, updates are clipped and noised per row
(`models.privacy.clip_rows` / `add_gaussian_noise`), and the new private
rows are written back per device (atomically, before the device advertises
keys). There is no per-device Python loop around training.

A round that cannot be trained raises `TrainingError` whose `reason` is a
`TrainingFailure` (the AbortReason the client withdraws its devices with).

Randomness: private-state initialisation, training negatives and mini-batch
orders are keyed draws (`models/keyed_random.py`): pure functions of
(--seed, the task's round_idx, the device's user id, purpose, index), so a
device trains exactly as in `fedmask simulate --seed S` whichever devices
share its process or batch. DP noise and the stochastic rounding of the
secagg encoding always come from os.urandom (a seeded noise would let anyone
who knows the seed subtract it).

Imports: `models` at module level (torch is needed anyway), except
`models.privacy`, imported on the first round with DP: its dp_accounting
adds ~0.9 s of start-up on top of torch (measured with `python -X importtime`).
"""

from __future__ import annotations

import enum
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from edge_client.global_model import LatestGlobal
from edge_client.local_data import DatasetError, LocalData
from edge_client.state import StateCorruptError
from edge_client.task import SYNTHETIC_MODEL, TaskSpec
from fedmask_proto.v1 import common_pb2
from models.base import (
    CohortData,
    FederatedRecommender,
    GlobalState,
    LocalRound,
    PrivateState,
    resolve_device,
    take_cohort,
    take_rows,
)
from models.data.sampling import cohort_data
from models.evaluation import evaluate
from models.registry import ConfigError, build_model
from wire.protocol import ROUND_INDEX_HYPERPARAMETER

log = logging.getLogger("edge_client.trainer")

#: Threads writing the devices' private state after a batch trained (save_private).
SAVE_WORKERS = 8
# hyperparameters_json keys that are not model constructor arguments
_NON_MODEL_KEYS = frozenset(
    {ROUND_INDEX_HYPERPARAMETER, "local_round", "curriculum_round", "explicit", "seed", "scale", "vector_length", "dataset", "n_users", "n_items"}
)


class TrainingFailure(enum.Enum):
    """Why a round cannot be trained here; the value is the proto AbortReason
    the client withdraws its devices with."""

    CLIENT_ERROR = common_pb2.ABORT_REASON_CLIENT_ERROR
    MODEL_MISMATCH = common_pb2.ABORT_REASON_MODEL_MISMATCH


class UnreadablePrivateState(Exception):
    """The stored private state of some devices of a batch cannot be read
    (`unreadable`: user number -> why); nothing was trained. Those devices
    stand down; the rest of the batch can train without them."""

    def __init__(self, unreadable: dict[int, str]) -> None:
        super().__init__(f"{len(unreadable)} device(s) with unreadable private state")
        self.unreadable = unreadable


class TrainingError(Exception):
    """The round cannot be trained on this client (user-facing message)."""

    def __init__(self, message: str, reason: TrainingFailure = TrainingFailure.CLIENT_ERROR) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class TrainOutput:
    """The privatised updates of a trained batch (row b = the b-th device
    asked for) and each row's own metric values (`device_metrics(row)`)."""

    updates: np.ndarray  # float64 (B, L): clipped + noised, ready to encode
    examples: np.ndarray | None = None  # int64 (B,) training positives / ratings
    norms: np.ndarray | None = None  # float64 (B,) pre-clipping L2 norms
    clip_norm: float | None = None
    seconds: float = 0.0
    val_rows: list[dict[str, float]] | None = field(default=None, repr=False)  # per row, models/evaluation sums
    #: float64 (B,): each row's FedMMF privacy indicator J (models/fedmmf.py),
    #: None for models without one; read by the hybrid path choice (D64)
    privacy_indicator: np.ndarray | None = None

    def device_metrics(self, row: int) -> dict[str, float]:
        """One device's (batch row `row`) metric values, in the names of
        `wire.round_metrics.SLOTS`. They never leave the device as such:
        they go out as limbs of its masked input (D35)."""
        out: dict[str, float] = {"devices": 1.0}
        if self.examples is not None:
            out["examples"] = float(self.examples[row])
        if self.norms is not None and len(self.norms):
            out["update_norm"] = float(self.norms[row])
            if self.clip_norm is not None:
                out["clipped"] = float(self.norms[row] > self.clip_norm)
        if self.val_rows is not None:
            out.update({"val_" + k: float(v) for k, v in self.val_rows[row].items()})
        return out


@dataclass
class _ModelEntry:
    model: FederatedRecommender
    explicit: bool
    global_shapes: dict[str, tuple[int, ...]]
    private_shapes: dict[str, tuple[int, ...]] | None = None


class Trainer:
    """Local training of the hosted devices of one process (keyed by user number)."""

    #: The models these devices train (advertised in Hello; a RoundTask for
    #: another one is refused with MODEL_MISMATCH).
    supported_models: tuple[str, ...] = ("fedrap", "fedmmf", "pfedrec", "fedmf", SYNTHETIC_MODEL)

    def __init__(
        self,
        data: LocalData,
        *,
        seed: int = 0,
        torch_device: str = "cpu",
        global_path: os.PathLike[str] | str | None = None,
        secure_random: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self.data = data
        self.x = data.x
        self.n_users, self.n_items = data.n_users, data.n_items
        self.devices = data.devices
        self.seed = seed
        self.device = resolve_device(torch_device, DatasetError)
        #: the global model of the latest task trained (public; for queries)
        self.latest = LatestGlobal(global_path)
        self.secure_random = secure_random
        self._models: dict[str, _ModelEntry] = {}

    # ------------------------------------------------------------ batch data
    def cohort(self, numbers: Sequence[int], explicit: bool) -> tuple[CohortData, Any]:
        """The padded training data of `numbers` (row b = device b) and its mini split."""
        s = self.data.splits(numbers)
        split = s.explicit if explicit else s.implicit
        data = cohort_data(split, np.arange(len(numbers)), device=self.device)
        return replace(data, users=torch.from_numpy(s.users.copy()).to(self.device)), split

    # ------------------------------------------------------------ models
    def model_for(self, name: str, hyper: Mapping[str, Any]) -> _ModelEntry:
        if "n_items" in hyper and hyper["n_items"] != self.n_items:
            raise TrainingError(
                f"the federation's model has n_items={hyper['n_items']}, this client's dataset "
                f"{self.x.name} has {self.n_items}",
                TrainingFailure.MODEL_MISMATCH,
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
                raise TrainingError(f"cannot build model {name!r}: {e}", TrainingFailure.MODEL_MISMATCH) from None
            g = torch.Generator(device=self.device).manual_seed(0)
            with torch.no_grad():
                shapes = {k: tuple(v.shape) for k, v in model.init_global(g).items()}
            entry = _ModelEntry(model, explicit, shapes)
            self._models[key] = entry
        return entry

    def globals_for(self, entry: _ModelEntry, params: Mapping[str, np.ndarray], name: str) -> GlobalState:
        """The task's global parameters as tensors; TrainingError (model mismatch)
        if their shapes do not fit this client's dataset."""
        got = {k: tuple(np.shape(v)) for k, v in params.items()}
        if got != entry.global_shapes:
            raise TrainingError(
                f"global parameters of {name} do not fit this client's dataset "
                f"({self.x.name}: {self.n_items} items): got {got}, expected {entry.global_shapes}",
                TrainingFailure.MODEL_MISMATCH,
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
                    take_cohort(data, torch.zeros(1, dtype=torch.int64, device=self.device)),
                    global_,
                    self.seed,
                )
            entry.private_shapes = {k: tuple(v.shape[1:]) for k, v in tmpl.items()}
        rows: dict[int, dict[str, np.ndarray]] = {}
        unreadable: dict[int, str] = {}
        for n in numbers:
            try:
                got = self.devices[n].store.load_model(name)
            except StateCorruptError as e:
                unreadable[n] = str(e)
                continue
            if got is None:
                continue
            arrays, _meta = got
            if {k: tuple(v.shape) for k, v in arrays.items()} != entry.private_shapes:
                log.warning("%s: stored %s state has other shapes (hyperparameters changed?); re-initialising",
                            self.devices[n].local_id, name)
                continue
            rows[n] = arrays
        if unreadable:
            raise UnreadablePrivateState(unreadable)
        missing = [i for i, n in enumerate(numbers) if n not in rows]
        fresh: PrivateState | None = None
        if missing:
            idx = torch.tensor(missing, dtype=torch.int64, device=self.device)
            with torch.no_grad():
                fresh = entry.model.init_private(take_cohort(data, idx), global_, self.seed)
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
        """Write each device's new private rows (atomically and durably, one
        file per device); returns when every file is written, or raises the
        first error. The files are written by SAVE_WORKERS threads at once:
        each write is still fsynced (file and folder) before this returns,
        and concurrent fsyncs share the file system's journal commits (225
        devices: 1.8 s one after another, 0.35 s eight at a time)."""
        from concurrent.futures import ThreadPoolExecutor

        host = {k: v.detach().to("cpu").numpy() for k, v in private.items()}

        def save(i: int) -> None:
            self.devices[numbers[i]].store.save_model(
                name,
                {k: np.array(v[i], copy=True) for k, v in host.items()},
                {"model_version": int(model_version), "round_number": int(round_number), "saved_at": time.time()},
            )

        if len(numbers) <= 1:
            for i in range(len(numbers)):
                save(i)
            return
        with ThreadPoolExecutor(min(SAVE_WORKERS, len(numbers)), thread_name_prefix="fedmask-save") as pool:
            for _ in pool.map(save, range(len(numbers))):
                pass

    # ------------------------------------------------------------ training
    def train(self, task: TaskSpec, numbers: Sequence[int]) -> TrainOutput:
        """Train the devices `numbers` together; persist their new private
        state; return their privatised updates and metric sums."""
        t0 = time.perf_counter()
        if task.model_name == SYNTHETIC_MODEL:
            raise TrainingError("synthetic rounds do not train; use synthetic_updates")
        entry = self.model_for(task.model_name, task.hyperparameters)
        model = entry.model
        if model.update_dim != task.vector_length:
            raise TrainingError(
                f"{task.model_name} on {self.x.name} has update_dim {model.update_dim}, the round expects "
                f"vector_length {task.vector_length}",
                TrainingFailure.MODEL_MISMATCH,
            )
        global_ = self.globals_for(entry, task.global_params, task.model_name)
        self.latest.remember(task)
        data, split = self.cohort(numbers, entry.explicit)
        private = self._load_private(entry, task.model_name, numbers, data, global_)
        with torch.no_grad():
            new_private, upd = model.local_update(LocalRound(global_, private, data, task.round_idx, self.seed))
        B = len(numbers)
        if tuple(upd.shape) != (B, model.update_dim):
            raise TrainingError(f"{task.model_name}.local_update returned shape {tuple(upd.shape)}")
        norms: torch.Tensor | None = None
        clip_norm = None
        if upd.shape[1] > 0:  # else nothing is sent (FedRAP-D): no norms, no DP
            upd, norms, clip_norm = self._privatise(task, upd)
        self.save_private(task.model_name, numbers, new_private,
                          model_version=task.model_version, round_number=task.round_number)

        # each device's own validation sums, now: they are appended to its
        # masked input (D35)
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
            privacy_indicator=(new_private["J"].detach().to("cpu", torch.float64).numpy()
                               if "J" in new_private else None),
        )

    def _privatise(self, task: TaskSpec, upd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float | None]:
        """A batch's trained updates (B, L > 0) as they are sent, their L2 norms and the clip
        norm applied (None: not clipped). Under local or distributed DP each row is clipped to
        the task's dp_clip_norm (the norms are then those before clipping, as `clip_rows`
        returns them) and gets Gaussian noise from the secure generator; under the discrete
        Gaussian (D88) the encoding clips and adds the noise, so the rows stay as they are.
        TrainingError for a non-finite update."""
        norms = torch.linalg.vector_norm(upd, dim=1)
        clip_norm = None
        if task.dp_mode in ("local", "distributed") and not task.dp_discrete:
            from models.privacy import add_gaussian_noise, clip_rows  # imported on first use: see the module doc

            if task.dp_clip_norm > 0:
                upd, norms = clip_rows(upd, clip=task.dp_clip_norm)
                clip_norm = task.dp_clip_norm
            if task.dp_noise_stddev > 0:
                upd = add_gaussian_noise(upd, std=task.dp_noise_stddev, generator=self._secure_generator())
        if not bool(torch.isfinite(upd).all()):
            raise TrainingError("local training produced a non-finite update")
        return upd, norms, clip_norm

    def _validation_sums(self, model, global_, private, split, explicit, numbers, rows) -> dict[str, float]:
        """Validation sums of the batch rows `rows` (models/evaluation.py), scored with
        each device's new private state and the round's global parameters."""
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
        """The benchmark's made-up updates (`synthetic_updates`). A task whose
        synthetic model has an item catalogue (hyper-parameter n_items) is
        remembered like a trained one, so the devices answer top-k from it
        (edge_client/queries.py `synthetic_scores`)."""
        if "n_items" in task.hyperparameters:
            self.latest.remember(task)
        return TrainOutput(
            updates=synthetic_updates(
                device_ids, round_number=task.round_number, vector_length=task.vector_length,
                seed=int(task.hyperparameters.get("seed", self.seed)),
                scale=float(task.hyperparameters.get("scale", clip)),
            ),
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
