"""A whole platform as one device: FREIB's local training in an edge client (D68).

In a cross-silo federation each edge-client process hosts one platform of
FREIB's setting (`fedmask client --platform P --platforms M
--dirichlet-beta B`): one device, enrolled and aggregated like any other,
whose data are all the ratings of the platform's users. The platform split
is `models.data.platforms.make_platform_split` of the dataset with the
client's --seed, M and beta, so platform P here holds exactly the users of
platform P-1 in `fedmask simulate --platforms M --dirichlet-beta B --seed S`
(in a deployment each silo would load only its own ratings; recomputing the
split is what lets a test check the federation against simulate).

`PlatformTrainer.train` is `models.freib.local_train` with M = 1 on the
platform's ratings, from the round's global parameters and prototypes
(`models.platform_federation.unpack_global`); the platform's user
embeddings (and nothing else) are its private state, kept in the device's
store between rounds. The upload is the change of the shared parameters,
then the K local prototypes and their K presence flags, clipped and noised
as the RoundTask says like any device's. The validation sums it reports
are those of the platform's validation ratings, scored with the round's
global parameters and its new user rows.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from edge_client.devices import Device
from edge_client.local_data import LocalData
from edge_client.task import TaskSpec
from edge_client.trainer import TrainingError, TrainingFailure, TrainOutput, Trainer
from models.data.platforms import PlatformSplit, make_platform_split
from models.data.types import Interactions
from models.evaluation import rating_sums
from models.freib import PlatformModel, local_train, params_to, predict
from models.platform_federation import CROSS_SILO_MODELS, PlatformHyperparameterError, platform_model_from_hyperparameters, unpack_global
from models.platforms import platform_data

log = logging.getLogger("edge_client.platform_trainer")


@dataclass(frozen=True)
class PlatformHosting:
    """Which platform this process hosts: `platform` (1-based) of `n_platforms`, split with `beta`."""

    platform: int
    n_platforms: int = 5
    beta: float = 1.0

    def __post_init__(self) -> None:
        if self.n_platforms < 1:
            raise ValueError(f"--platforms must be >= 1, got {self.n_platforms}")
        if not 1 <= self.platform <= self.n_platforms:
            raise ValueError(f"--platform must be in 1..{self.n_platforms}, got {self.platform}")
        if not self.beta > 0:
            raise ValueError(f"--dirichlet-beta must be > 0, got {self.beta}")

    @property
    def index(self) -> int:
        """0-based platform id (simulate's platform m)."""
        return self.platform - 1


def platform_local_id(hosting: PlatformHosting) -> str:
    """The platform device's name in this process and on disk: "platform-3-of-5"."""
    return f"platform-{hosting.platform}-of-{hosting.n_platforms}"


class PlatformTrainer(Trainer):
    """Trains the one hosted platform device (see the module doc). Top-k
    queries are not served for a platform (its device is not a user)."""

    supported_models: tuple[str, ...] = CROSS_SILO_MODELS

    def __init__(
        self,
        x: Interactions,
        hosting: PlatformHosting,
        device: Device,
        *,
        seed: int = 0,
        torch_device: str = "cpu",
        global_path: os.PathLike[str] | str | None = None,
        secure_random: Callable[[int], bytes] = os.urandom,
    ) -> None:
        super().__init__(LocalData(x, [], split_seed=seed), seed=seed, torch_device=torch_device,
                         global_path=global_path, secure_random=secure_random)  # fmt: skip
        if device.number != hosting.platform:
            raise ValueError(f"the platform device must have number {hosting.platform}, got {device.number}")
        try:
            self.split: PlatformSplit = make_platform_split(x, n_platforms=hosting.n_platforms, beta=hosting.beta, seed=seed)
        except ValueError as e:
            raise TrainingError(f"cannot split {x.name} into {hosting.n_platforms} platforms: {e}") from None
        self.hosting = hosting
        self.platform_device = device
        self.n_users, self.n_items = self.split.n_users, self.split.n_items
        m = hosting.index
        self.platform_ratings = platform_data(self.split, self.split.user_platform, self.split.n_platforms).row(m).to(self.device)
        self.users = np.flatnonzero(self.split.user_platform == m)
        lo, hi = self.split.rating_range
        self.center = (lo + hi) / 2.0

    # ------------------------------------------------------------ the model
    def platform_model(self, task: TaskSpec) -> PlatformModel:
        """The round's model; MODEL_MISMATCH when it is not a platform model
        or does not fit this platform's dataset (catalogue, levels, scale)."""
        if task.model_name not in CROSS_SILO_MODELS:
            raise TrainingError(
                f"this client hosts a platform and trains {', '.join(CROSS_SILO_MODELS)} only, not {task.model_name!r}",
                TrainingFailure.MODEL_MISMATCH,
            )
        hp = task.hyperparameters
        want = {"n_users": self.split.n_users, "n_items": self.split.n_items, "n_levels": len(self.split.levels)}
        bad: dict[str, tuple[object, object]] = {k: (hp.get(k), v) for k, v in want.items() if hp.get(k) != v}
        if "center" in hp and not np.isclose(float(hp["center"]), self.center):
            bad["center"] = (hp["center"], self.center)
        if bad:
            raise TrainingError(
                f"the federation's {task.model_name} does not fit this platform's data ({self.x.name}): "
                + ", ".join(f"{k} {a} here {b}" for k, (a, b) in bad.items()),
                TrainingFailure.MODEL_MISMATCH,
            )
        try:
            model = platform_model_from_hyperparameters(task.model_name, {**hp, "center": self.center})
        except PlatformHyperparameterError as e:
            raise TrainingError(str(e), TrainingFailure.MODEL_MISMATCH) from None
        if model.update_dim != task.vector_length:
            raise TrainingError(
                f"{task.model_name} has update_dim {model.update_dim}, the round expects {task.vector_length}",
                TrainingFailure.MODEL_MISMATCH,
            )
        return model

    def _load_user(self, model: PlatformModel, name: str) -> dict[str, torch.Tensor]:
        """The platform's user tables (n_users, ...): stored rows of its own
        users over the keyed initialisation (the same draw as simulate's)."""
        table = model.init_user(torch.arange(model.n_users), self.seed)
        got = self.platform_device.store.load_model(name)
        if got is not None:
            arrays, _ = got
            fits = set(arrays) == {"users", *table} and np.array_equal(arrays["users"], self.users) and all(
                tuple(arrays[k].shape) == (len(self.users), *table[k].shape[1:]) for k in table
            )
            if fits:
                idx = torch.from_numpy(self.users)
                for k in table:
                    table[k][idx] = torch.from_numpy(np.asarray(arrays[k], dtype=np.float32))
            else:
                log.warning("%s: stored %s state does not fit this platform's users or the model; re-initialising",
                            self.platform_device.local_id, name)
        return params_to(table, self.device)

    # ------------------------------------------------------------ training
    def train(self, task: TaskSpec, numbers: Sequence[int]) -> TrainOutput:
        t0 = time.perf_counter()
        if list(numbers) != [self.hosting.platform]:
            raise TrainingError(f"this client hosts platform {self.hosting.platform} only, asked for {list(numbers)}")
        model = self.platform_model(task)
        try:
            shared, protos = unpack_global(model, task.global_params)
        except ValueError as e:
            raise TrainingError(str(e), TrainingFailure.MODEL_MISMATCH) from None
        shared = params_to(shared, self.device)
        protos = None if protos is None else protos.to(self.device)
        self.latest.remember(task)
        user = self._load_user(model, task.model_name)
        platform = params_to(model.init_platform(1), self.device)
        res = local_train(model, shared, user, platform, self.platform_ratings, protos, task.round_idx, self.seed)
        upd, norms, clip_norm = self._privatise(task, res.update)
        idx = torch.from_numpy(self.users).to(self.device)
        self.platform_device.store.save_model(
            task.model_name,
            {"users": self.users, **{k: v[idx].cpu().numpy() for k, v in res.user.items()}},
            {"model_version": int(task.model_version), "round_number": int(task.round_number), "saved_at": time.time()},
        )
        return TrainOutput(
            updates=upd.detach().to("cpu", torch.float64).numpy(),
            examples=np.array([int(self.platform_ratings.lengths[0])], dtype=np.int64),
            norms=norms.detach().to("cpu", torch.float64).numpy(),
            clip_norm=clip_norm,
            seconds=time.perf_counter() - t0,
            val_rows=[self._validation(model, shared, res.user)],
        )

    def _validation(self, model: PlatformModel, shared: dict[str, torch.Tensor], user: dict[str, torch.Tensor]) -> dict[str, float]:
        """Squared / absolute error sums over the platform's validation ratings (models/evaluation.py)."""
        val = self.split.val
        rows = np.flatnonzero(self.split.user_platform[val.user] == self.hosting.index)
        dev = self.device
        with torch.no_grad():
            pred = predict(model, shared, user, params_to(model.init_platform(1), dev), 0,
                           torch.from_numpy(val.user[rows]).to(dev), torch.from_numpy(val.item[rows]).to(dev))  # fmt: skip
            return rating_sums(pred, torch.from_numpy(val.rating[rows]).to(dev), None, self.split.rating_range)


__all__ = ["PlatformHosting", "PlatformTrainer"]
