"""The coordinator as FREIB's server in a cross-silo federation (D68).

`PlatformServerModel` puts `models.platform_federation` behind the
coordinator's `ServerModel` protocol (coordinator/model_host.py): every
device of the cohort is a whole platform (an edge client started with
`fedmask client --platform P --platforms M`), the global state is FREIB's
shared parameters plus the global prototypes and their presence flags, and
`apply_mean` is FREIB's server step on the securely aggregated mean.

Hyper-parameters: ``n_users``, ``n_items``, ``n_levels`` (required: the
catalogue and the rating levels of the platforms' dataset), optionally
``center`` (the middle of the rating scale), ``n_platforms`` (the planned
cohort M, default 5; see `models.platform_federation` for why it only
sets the presence threshold) and any FREIB setting (D27, D67). The devices
check the catalogue and levels against their own split and withdraw with
MODEL_MISMATCH when they differ.

Imports: `models` at module level (it brings torch). coordinator/model_host.py
imports this module only when it builds a model other than the synthetic one,
so a coordinator without a real model still starts without torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from coordinator.hosted_model import HostedModel
from models.keyed_random import global_init_generator
from models.platform_federation import global_shapes, pack_global, platform_model_from_hyperparameters, server_apply

DEFAULT_PLATFORMS = 5


@dataclass
class PlatformServerModel(HostedModel):
    """See the module doc; `model` is a models.freib.PlatformModel."""

    @property
    def n_platforms(self) -> int:
        return int(self.config.get("n_platforms", DEFAULT_PLATFORMS))

    @property
    def metric_names(self) -> tuple[str, ...]:
        """Training counts and the explicit validation sums (RMSE / MAE)."""
        return ("devices", "examples", "update_norm", "val_sse", "val_sae", "val_rating_count")

    def init_parameters(self, seed: int) -> dict[str, np.ndarray]:
        """`fedmask simulate --platforms M --seed S`'s initial global state."""
        return pack_global(self.model, self.model.init_shared(global_init_generator(int(seed))), None)

    def apply_mean(self, params: Mapping[str, np.ndarray], mean: np.ndarray, step: int) -> dict[str, np.ndarray]:
        return server_apply(self.model, params, mean, self.n_platforms)

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return global_shapes(self.model)


def build_platform_server_model(name: str, hyperparameters: Mapping[str, Any]) -> PlatformServerModel:
    """FREIB's server; ValueError (the caller's ModelConfigError) for bad hyper-parameters."""
    hp = dict(hyperparameters)
    n = hp.get("n_platforms", DEFAULT_PLATFORMS)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n_platforms must be an int >= 1, got {n!r}")
    return PlatformServerModel(name, hp, platform_model_from_hyperparameters(name, hp))
