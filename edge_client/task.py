"""What a round asks this client to train: `TaskSpec`, built from a checked
RoundTask (`task_spec(view)`; `wire.parse_round_task` did the checking).

The spec carries the public inputs of training only: the model, its
hyper-parameters (without the protocol's own switches), the global
parameters, the update length and the DP settings. The round's secagg
configuration and ids stay with the session.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

import wire
from fedmask_proto.v1 import session_pb2
from wire.protocol import HYBRID_J_BOUND_HYPERPARAMETER, PLAINTEXT_HYPERPARAMETER, ROUND_INDEX_HYPERPARAMETER

#: RoundTask hyper-parameters that configure the round, not the model.
_ROUND_POLICY_KEYS = frozenset({PLAINTEXT_HYPERPARAMETER, HYBRID_J_BOUND_HYPERPARAMETER})

#: The benchmark's stand-in model: no training, updates from (seed, round, device).
SYNTHETIC_MODEL = "synthetic"

_DP_MODES = {
    session_pb2.DP_MODE_NONE: "none",
    session_pb2.DP_MODE_LOCAL: "local",
    session_pb2.DP_MODE_DISTRIBUTED: "distributed",
}


@dataclass(frozen=True)
class TaskSpec:
    """What training needs from a RoundTask."""

    model_name: str
    model_version: int
    round_number: int
    round_idx: int  # the model's round counter (curriculum)
    hyperparameters: Mapping[str, Any]
    global_params: Mapping[str, np.ndarray]
    vector_length: int  # of the model update (the masked vector less its metric coordinates)
    dp_mode: str = "none"  # none | local | distributed
    dp_clip_norm: float = 0.0
    dp_noise_stddev: float = 0.0
    #: True: the discrete Gaussian (D88) clips and adds the noise when the
    #: update is encoded (`RoundRun.encode`), so training leaves it as it is.
    dp_discrete: bool = False


def task_spec(view: wire.RoundTaskView) -> TaskSpec:
    """The training part of a checked RoundTask. The model's round counter is
    the task's `round_idx` hyper-parameter (the round number when absent)."""
    hyper = {k: v for k, v in view.hyperparameters.items() if k not in _ROUND_POLICY_KEYS}
    round_idx = hyper.get(ROUND_INDEX_HYPERPARAMETER, view.round_number)
    return TaskSpec(
        model_name=view.model_name,
        model_version=view.model_version,
        round_number=view.round_number,
        round_idx=int(round_idx) if isinstance(round_idx, int | float) else view.round_number,
        hyperparameters=hyper,
        global_params=view.global_parameters,
        vector_length=view.update_length,
        dp_mode=_DP_MODES.get(view.dp.mode, "none"),
        dp_clip_norm=float(view.dp.clip_norm),
        dp_noise_stddev=float(view.dp.noise_stddev),
        dp_discrete=view.mechanism is not None,
    )
