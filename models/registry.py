"""The model catalogue: which recommenders exist, how one is built, which
are explicit, and the one error a model, dataset or simulation setting that
cannot run raises.

Production code (the coordinator's server step, an edge client's trainer,
the `fedmask` commands) takes models from here, never from the simulator
(`models/sim/`); pyproject.toml's import-linter contracts hold the
coordinator and the edge client to that.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch

    from models.base import FederatedRecommender

MODEL_NAMES: tuple[str, ...] = ("fedrap", "fedmmf", "pfedrec", "fedmf")
IMPLICIT_ONLY = ("fedrap", "pfedrec")

# rounds of the tuned defaults (docs/tuning.md)
DEFAULT_ROUNDS: dict[str, int] = {"fedrap": 100, "pfedrec": 100, "fedmf": 100, "fedmmf": 150}
DEFAULT_ROUNDS_EXPLICIT_FEDMF = 150


class ConfigError(ValueError):
    """A model, a dataset or a simulation was asked for something that cannot
    run (the message is user-facing). The simulator's `SimulationConfigError`
    is this class.

    Not to be confused with `secagg.errors.SecAggConfigError` (a secure-aggregation
    configuration that cannot run safely)."""


def build_model(
    name: str,
    *,
    explicit: bool,
    n_users: int,
    n_items: int,
    item_features: np.ndarray | torch.Tensor | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> FederatedRecommender:
    """A model with its tuned defaults (the constructors' defaults), plus
    `overrides`; ConfigError for an unknown name or hyperparameter."""
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
            import numpy as np
            import torch

            from models.fedmmf import FedMMF

            feats = None
            if item_features is not None:
                feats = torch.as_tensor(np.asarray(item_features), dtype=torch.float32)
            return FedMMF(n_users, n_items, feats, **kw)
    except TypeError as e:  # an unknown hyperparameter name
        raise ConfigError(f"bad parameter for model {name!r}: {e}") from e
    raise ConfigError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")


def model_is_explicit(name: str, explicit_flag: bool) -> bool:
    """Whether model `name` trains on explicit ratings: fedmmf always, fedmf
    with --explicit; ConfigError for an unknown model or --explicit on an
    implicit-only one."""
    if name not in MODEL_NAMES:
        raise ConfigError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    if name == "fedmmf":
        return True
    if explicit_flag and name in IMPLICIT_ONLY:
        raise ConfigError(f"--explicit is only for fedmf (fedmmf is always explicit); {name} is implicit")
    return explicit_flag


def default_rounds(model: str, explicit: bool) -> int:
    """Rounds of the tuned defaults when --rounds is not given."""
    if model == "fedmf" and explicit:
        return DEFAULT_ROUNDS_EXPLICIT_FEDMF
    return DEFAULT_ROUNDS[model]
