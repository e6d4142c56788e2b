"""A simulation's final global state on disk (`--save-global`): an .npz of
float32 arrays, one per parameter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.base import GlobalState


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
