"""The platform-level models' catalogue (FREIB and the baselines whose
clients are platforms; the models themselves are in models/freib.py): their
names, tuned defaults and default rounds, how one is built for a split, and
the training data of every platform. `fedmask simulate --platforms M`
(models/sim/) and a platform's edge client both take them from here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from models.data.platforms import PlatformSplit, level_index
from models.freib import PlatformData, PlatformModel

PLATFORM_MODELS: tuple[str, ...] = ("freib", "fedmf", "pfedrec", "central-mf")
ABLATIONS: dict[str, str] = {"bias": "bias_encoder", "guidance": "guidance", "prototypes": "prototypes"}

# each model's defaults on top of PlatformModel's (chosen on validation, docs/decisions.md D27, D79, D80:
# the federated baselines train one local epoch of batches of 128 per round over 150 rounds; FREIB a
# quarter of an epoch per round over 600 rounds, its learning rate falling at D79's pace per step)
_ONE_EPOCH: dict[str, Any] = {"local_epochs": 1, "batch_size": 128, "lr_decay": 0.96}
_MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "freib": {"backbone": "ncf", "local_epochs": 1, "local_fraction": 0.25, "batch_size": 128, "lr": 0.01,
              "lr_decay": 0.99, "weight_decay": 3e-3, "init_std": 0.01},
    "fedmf": {"backbone": "mf", "bias_encoder": False, "guidance": False, "prototypes": False,
              **_ONE_EPOCH, "lr": 0.1, "l2": 0.02},
    "pfedrec": {"backbone": "pfedrec", "bias_encoder": False, "guidance": False, "prototypes": False,
                **_ONE_EPOCH, "lr": 0.05, "l2": 0.05},
    "central-mf": {"backbone": "biasedmf", "bias_encoder": False, "guidance": False, "prototypes": False,
                   "lr": 0.05, "l2": 0.05},
}  # fmt: skip


def model_defaults(name: str) -> dict[str, Any]:
    """The tuned defaults of a platform-level model (D27, D67, D79, D80), on top of PlatformModel's."""
    if name not in _MODEL_DEFAULTS:
        raise PlatformConfigError(f"unknown platform-level model {name!r}; choose one of {', '.join(PLATFORM_MODELS)}")
    return dict(_MODEL_DEFAULTS[name])


#: rounds when --rounds is not given (the paper's E is 50 rounds of 10 local epochs): the baselines one
#: epoch a round (D79), FREIB a quarter of one (D80), the centralised MF two (D27)
DEFAULT_PLATFORM_ROUNDS: dict[str, int] = {"freib": 600, "fedmf": 150, "pfedrec": 150, "central-mf": 150}


class PlatformConfigError(ValueError):
    """A platform-level simulation was asked for something that cannot run (user-facing)."""


def build_platform_model(
    name: str, split: PlatformSplit, overrides: Mapping[str, Any] | None = None, ablate: tuple[str, ...] = ()
) -> PlatformModel:
    if name not in PLATFORM_MODELS:
        raise PlatformConfigError(f"unknown platform-level model {name!r}; choose one of {', '.join(PLATFORM_MODELS)}")
    kw: dict[str, Any] = dict(_MODEL_DEFAULTS[name])
    lo, hi = split.rating_range
    kw["center"] = (lo + hi) / 2.0  # public: the middle of the rating scale
    for a in ablate:
        if a not in ABLATIONS:
            raise PlatformConfigError(f"--ablate takes {', '.join(ABLATIONS)}, not {a!r}")
        if name != "freib":
            raise PlatformConfigError("--ablate applies to --model freib only")
        kw[ABLATIONS[a]] = False
    kw.update(overrides or {})
    if "mlp" in kw and isinstance(kw["mlp"], list):
        kw["mlp"] = tuple(int(v) for v in kw["mlp"])
    try:
        return PlatformModel(n_users=split.n_users, n_items=split.n_items, n_levels=len(split.levels), **kw)
    except (TypeError, ValueError) as e:
        raise PlatformConfigError(f"bad parameter for {name}: {e}") from e


def platform_data(split: PlatformSplit, user_platform: np.ndarray, n_platforms: int) -> PlatformData:
    """The training ratings grouped by platform and padded."""
    tr = split.train
    plat = user_platform[tr.user]
    order = np.argsort(plat, kind="stable")
    counts = np.bincount(plat, minlength=n_platforms)
    L = int(counts.max()) if len(counts) else 0
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    col = np.arange(len(order)) - starts[plat[order]]
    U = np.zeros((n_platforms, L), dtype=np.int64)
    It = np.zeros((n_platforms, L), dtype=np.int64)
    R = np.zeros((n_platforms, L), dtype=np.float32)
    Lv = np.zeros((n_platforms, L), dtype=np.int64)
    row = plat[order]
    U[row, col], It[row, col], R[row, col] = tr.user[order], tr.item[order], tr.rating[order]
    Lv[row, col] = level_index(split.levels, tr.rating[order])
    return PlatformData(
        platforms=torch.arange(n_platforms),
        users=torch.from_numpy(U),
        items=torch.from_numpy(It),
        ratings=torch.from_numpy(R),
        level=torch.from_numpy(Lv),
        lengths=torch.from_numpy(counts.astype(np.int64)),
    )
