"""FREIB across processes: what the coordinator and a platform's edge client share.

A cross-silo federation (docs/decisions.md D68) runs FREIB's protocol with
each platform as one edge-client device and the coordinator as FREIB's
server. Both sides build the same `PlatformModel` from the round's
hyper-parameters (`platform_model_from_hyperparameters`), and the global
state travels as a flat dict of float32 arrays (`pack_global` /
`unpack_global`):

- the shared parameters (everything but the user embeddings), by name;
- ``proto`` (K, d_bias): the global prototypes G_k, zeros where no platform
  had level k, and ``proto_present`` (K,): 1.0 where G_k is defined, 0.0
  otherwise (before the first aggregation: all 0, i.e. FREIB's "no
  prototype yet"). NaN never travels.

`server_apply` is the coordinator's server step: `models.freib.server_step`
on the decoded mean of the uploads. With `n_platforms` the planned cohort
(M), a level counts as present when its mean flag exceeds 1/(2M); that holds
for every level some survivor had whatever the number of survivors k <= M
(its mean flag is >= 1/k), so dropouts do not hide levels, and the prototype
mean sum(P)/sum(flags) does not depend on M at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from models.freib import Params, PlatformModel, server_step
from models.platforms import model_defaults

#: Platform-level models the coordinator can host over gRPC (the baselines run in `fedmask simulate`).
CROSS_SILO_MODELS: tuple[str, ...] = ("freib",)
PROTO, PROTO_PRESENT = "proto", "proto_present"
#: Hyper-parameter keys that describe the data, not the model's settings.
DATA_KEYS: tuple[str, ...] = ("n_users", "n_items", "n_levels", "center", "n_platforms")


class PlatformHyperparameterError(ValueError):
    """The hyper-parameters do not describe a platform model (user-facing)."""


def platform_model_from_hyperparameters(name: str, hp: Mapping[str, Any]) -> PlatformModel:
    """FREIB's model from a round's hyper-parameters: ``n_users``, ``n_items``
    (the catalogue), ``n_levels`` (rating levels, e.g. 5 for ML-100K),
    ``center`` (the middle of the rating scale) and any `PlatformModel`
    field as an override of the tuned defaults (D27, D79, D80). Keys outside
    those (the protocol's own, e.g. ``round_idx``) are ignored."""
    if name not in CROSS_SILO_MODELS:
        raise PlatformHyperparameterError(f"not a cross-silo platform model: {name!r} (one of {CROSS_SILO_MODELS})")
    missing = [k for k in ("n_users", "n_items", "n_levels") if k not in hp]
    if missing:
        raise PlatformHyperparameterError(f"model {name!r} needs hyperparameters {missing}")
    fields = set(PlatformModel.__dataclass_fields__) - {"n_users", "n_items", "n_levels"}
    kw: dict[str, Any] = model_defaults(name)
    kw.update({k: v for k, v in hp.items() if k in fields})
    if isinstance(kw.get("mlp"), list):
        kw["mlp"] = tuple(int(v) for v in kw["mlp"])
    try:
        return PlatformModel(n_users=int(hp["n_users"]), n_items=int(hp["n_items"]), n_levels=int(hp["n_levels"]), **kw)
    except (TypeError, ValueError) as e:
        raise PlatformHyperparameterError(f"bad hyperparameter for {name}: {e}") from e


def pack_global(model: PlatformModel, shared: Params, protos: torch.Tensor | None) -> dict[str, np.ndarray]:
    """The global state as float32 arrays (see the module doc)."""
    out = {k: v.detach().cpu().numpy().astype(np.float32) for k, v in shared.items()}
    if model.uses_prototypes:
        K, kb = model.n_levels, model.k_bias
        if protos is None:
            out[PROTO] = np.zeros((K, kb), dtype=np.float32)
            out[PROTO_PRESENT] = np.zeros(K, dtype=np.float32)
        else:
            present = ~torch.isnan(protos.detach().cpu()).any(dim=1)
            out[PROTO] = torch.nan_to_num(protos.detach().cpu(), nan=0.0).numpy().astype(np.float32)
            out[PROTO_PRESENT] = present.numpy().astype(np.float32)
    return out


def global_shapes(model: PlatformModel) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in pack_global(model, model.init_shared(torch.Generator().manual_seed(0)), None).items()}


def unpack_global(model: PlatformModel, params: Mapping[str, np.ndarray]) -> tuple[Params, torch.Tensor | None]:
    """(shared parameters, global prototypes with NaN rows for absent levels or
    None when no level is present); ValueError when the arrays do not fit the model."""
    want = global_shapes(model)
    got = {k: tuple(np.shape(v)) for k, v in params.items()}
    if got != want:
        raise ValueError(f"global parameters do not fit the model: got {got}, expected {want}")
    shared = {n: torch.from_numpy(np.array(params[n], dtype=np.float32)) for n in model.shared_names()}
    if not model.uses_prototypes:
        return shared, None
    present = np.asarray(params[PROTO_PRESENT]) > 0.5
    if not present.any():
        return shared, None
    g = torch.from_numpy(np.array(params[PROTO], dtype=np.float32))
    g[torch.from_numpy(~present)] = float("nan")
    return shared, g


def server_apply(
    model: PlatformModel, params: Mapping[str, np.ndarray], mean: np.ndarray, n_platforms: int
) -> dict[str, np.ndarray]:
    """The coordinator's server step: FedAvg of the shared parameters and the
    global prototypes from the decoded mean upload (length `model.update_dim`)."""
    if n_platforms < 1:
        raise ValueError("n_platforms must be >= 1")
    mean = np.asarray(mean)
    if mean.shape != (model.update_dim,):
        raise ValueError(f"mean update has shape {mean.shape}, expected ({model.update_dim},)")
    shared, _ = unpack_global(model, params)
    with torch.no_grad():
        new, g = server_step(model, shared, torch.from_numpy(np.ascontiguousarray(mean, dtype=np.float32)), n_platforms)
    return pack_global(model, new, g)
