"""The server side of a model: initial parameters and the server step.

`build_server_model(name, hyperparameters)` is the coordinator's factory:

* ``"synthetic"`` (benchmarks, tests): no learning. The update is a vector
  of ``vector_length`` floats the devices make up; the global parameters are
  one tensor ``"mean"`` (L,) holding the last round's decoded mean (zeros at
  version 0). Hyper-parameters: ``{"vector_length": L}`` and optionally
  ``"n_items": M`` (M >= 1, the devices' dataset items; they score only
  when M <= L): then devices
  answer top-k by reading the mean as an M x (L // M) item table
  (edge_client/queries.py `synthetic_scores`), so `fedmask bench admin` can
  load the relay without training a real model.
* any name of `models.registry.build_model` ("fedrap", "fedmf", "pfedrec",
  "fedmmf"): hyper-parameters must include ``n_users`` and ``n_items`` (the
  federation's catalogue; the server needs them to shape the global
  parameters) and may include ``explicit`` (fedmf) and the model's own
  overrides. The server step is the model's `apply_mean_update`.
* ``"freib"``: a cross-silo platform federation, each device a whole
  platform (coordinator/platform_model_host.py, D68).

Parameters travel as ``dict[str, np.ndarray]`` (float32). The model step
(`round_idx` of the model, its curriculum position) is the number of rounds
committed before, carried in the stored version's hyper-parameters as
``"step"``, so restarts and aborted rounds do not shift the curriculum.

Imports: of `models`, only `models.registry` at module level (no torch;
~6 ms measured). The model code (`models.keyed_random`,
`models.platform_federation`, coordinator/platform_model_host.py) imports
torch, ~1.1-1.4 s of start-up measured with `python -X importtime`, so it
is imported when a real model is built: a coordinator hosting the synthetic
model (benchmarks, tests) starts without torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from coordinator.hosted_model import HostedModel
from models.registry import ConfigError as CatalogueConfigError
from models.registry import build_model

SYNTHETIC = "synthetic"
# Keys of the model hyper-parameters the coordinator consumes itself.
_FACTORY_KEYS = ("n_users", "n_items", "explicit")


class ModelConfigError(ValueError):
    """The configured model cannot be built (unknown name, bad parameters)."""


class ServerModel(Protocol):
    name: str

    @property
    def update_dim(self) -> int:
        """Length of the flat update every device sends (secagg vector_length)."""
        ...

    @property
    def n_items(self) -> int | None:
        """Items in the catalogue (the bound of a top-k query); None for a
        model without items (synthetic)."""
        ...

    @property
    def metric_names(self) -> tuple[str, ...]:
        """The round metrics (names of `wire.round_metrics.SLOTS`) every
        device of this model can report; the coordinator asks for them in
        each secure round (D35)."""
        ...

    def hyperparameters(self) -> dict[str, Any]:
        """JSON-able hyper-parameters sent in every RoundTask (devices build
        the same model from them)."""
        ...

    def init_parameters(self, seed: int) -> dict[str, np.ndarray]: ...

    def apply_mean(self, params: Mapping[str, np.ndarray], mean: np.ndarray, step: int) -> dict[str, np.ndarray]:
        """The new global parameters from the mean update (float64 or
        float32, length update_dim) of round `step` (0-based)."""
        ...

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]: ...


@dataclass
class SyntheticModel:
    """See the module doc."""

    vector_length: int
    name: str = SYNTHETIC
    #: Items the devices score in a top-k (None: no catalogue, top-k refused).
    items: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.vector_length, int) and 1 <= self.vector_length <= 1 << 28):
            raise ModelConfigError(f"synthetic model: vector_length must be an int in 1..2^28, got {self.vector_length!r}")
        if self.items is not None and (isinstance(self.items, bool) or not isinstance(self.items, int)
                                       or self.items < 1):
            raise ModelConfigError(f"synthetic model: n_items must be an int >= 1, got {self.items!r}")

    @property
    def update_dim(self) -> int:
        return self.vector_length

    @property
    def n_items(self) -> int | None:
        """The catalogue the devices score (hyper-parameter n_items), or None."""
        return self.items

    @property
    def metric_names(self) -> tuple[str, ...]:
        """No training: only the count of devices."""
        return ("devices",)

    def hyperparameters(self) -> dict[str, Any]:
        hp: dict[str, Any] = {"vector_length": self.vector_length}
        if self.items is not None:
            hp["n_items"] = self.items
        return hp

    def init_parameters(self, seed: int) -> dict[str, np.ndarray]:
        return {"mean": np.zeros(self.vector_length, dtype=np.float32)}

    def apply_mean(self, params: Mapping[str, np.ndarray], mean: np.ndarray, step: int) -> dict[str, np.ndarray]:
        return {"mean": np.asarray(mean, dtype=np.float32)}

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"mean": (self.vector_length,)}


@dataclass
class RecommenderModel(HostedModel):
    """A `models` recommender behind the ServerModel protocol (torch inside)."""

    @property
    def metric_names(self) -> tuple[str, ...]:
        """Training counts and the validation sums of the model's kind
        (`models.evaluation`: sampled HR/NDCG@10 or squared / absolute errors)."""
        if getattr(self.model, "kind", "implicit") == "explicit":
            val: tuple[str, ...] = ("val_sse", "val_sae", "val_rating_count")
        else:
            val = ("val_sampled_hits@10", "val_sampled_ndcg@10", "val_sampled_count")
        return ("devices", "examples", "update_norm", *val)

    def init_parameters(self, seed: int) -> dict[str, np.ndarray]:
        from models.keyed_random import global_init_generator

        gen = global_init_generator(int(seed))  # the engine's initialisation, for the same seed
        return {k: v.detach().cpu().numpy().astype(np.float32) for k, v in self.model.init_global(gen).items()}

    def apply_mean(self, params: Mapping[str, np.ndarray], mean: np.ndarray, step: int) -> dict[str, np.ndarray]:
        import torch

        global_ = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in params.items()}
        upd = torch.from_numpy(np.ascontiguousarray(mean, dtype=np.float32))
        with torch.no_grad():
            out = self.model.apply_mean_update(global_, upd, step)
        return {k: v.detach().cpu().numpy().astype(np.float32) for k, v in out.items()}

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v.shape) for k, v in self.init_parameters(0).items()}


def build_server_model(name: str, hyperparameters: Mapping[str, Any] | None = None) -> ServerModel:
    """The coordinator's model factory (see the module doc)."""
    hp = dict(hyperparameters or {})
    if name == SYNTHETIC:
        unknown = set(hp) - {"vector_length", "n_items"}
        if unknown or "vector_length" not in hp:
            raise ModelConfigError(
                f"synthetic model takes the hyperparameter 'vector_length' and optionally 'n_items' (got {sorted(hp)})"
            )
        return SyntheticModel(hp["vector_length"], items=hp.get("n_items"))
    from coordinator.platform_model_host import build_platform_server_model
    from models.platform_federation import CROSS_SILO_MODELS

    if name in CROSS_SILO_MODELS:
        try:
            return build_platform_server_model(name, hp)
        except ValueError as exc:
            raise ModelConfigError(str(exc)) from exc
    missing = [k for k in ("n_users", "n_items") if k not in hp]
    if missing:
        raise ModelConfigError(f"model {name!r} needs hyperparameters {missing} (the federation's catalogue)")
    overrides = {k: v for k, v in hp.items() if k not in _FACTORY_KEYS}
    try:
        model = build_model(
            name,
            explicit=bool(hp.get("explicit", False)),
            n_users=int(hp["n_users"]),
            n_items=int(hp["n_items"]),
            overrides=overrides,
        )
    except (CatalogueConfigError, TypeError, ValueError) as exc:
        raise ModelConfigError(str(exc)) from exc
    if model.update_dim < 1:
        raise ModelConfigError(f"model {name!r} with these hyperparameters sends no update (update_dim 0)")
    return RecommenderModel(name, hp, model)
