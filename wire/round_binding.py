"""The round's session id commits to what its devices train on (pure).

A coordinator that sends different global models (or hyper-parameters, DP
settings...) to different devices of one round can make one device's
contribution stand out of the sum ("Eluding Secure Aggregation in Federated
Learning via Model Inconsistency", Pasquini, Francati and Ateniese). The
round therefore binds its session id to the task:

    session_id = nonce || task_digest(task)          (nonce: the coordinator's
                                                      random bytes, 1..NONCE_MAX)

`task_digest` is a SHA-256 over every part of the RoundTask that is the
same for every client of the round: round number, model name and version,
the global parameters (each tensor's name, dtype, shape and bytes), the
hyper-parameters' JSON text, the secagg settings, the DP settings, the
metric names and (active mode) the cohort. The per-client assignments and
the deadlines are left out.

The session id enters every signature (`secagg.identity`: AdvertiseKeys and
the consistency check), every key derivation and every share's associated
data (`secagg.keys`, `secagg.aead`), so:

- a device checks `binding_refusal(task)` and refuses a task whose session
  id does not commit to the task it received;
- a device sent a different task can only be given a different session id,
  and then its signature does not verify at its honest peers (they withdraw
  INVALID_SIGNATURE in active mode), its shares do not decrypt, and its masks
  do not cancel: it is never counted in a sum with the devices that got the
  other task.

`training_key(task)` is a second digest, over what one device's update is a
function of in the coordinator's eyes (model name, global parameters,
hyper-parameters including the curriculum step, and the DP mode, clip and
multiplier, not the cohort), for the device's rule "at most one
contribution per (model, task)" (edge_client.contributions). The DP
mechanism (D88) is left out on purpose: the update is the same function of
the model whichever noise it gets, and a key that changed with the
mechanism would let one device contribute twice to the same model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedmask_proto.v1 import common_pb2, session_pb2
from secagg.config import MAX_SESSION_ID_BYTES, SecAggConfig
from wire.ids import RoundIds
from wire.round_metrics import EMPTY_LAYOUT, MetricLayout
from wire.round_task import build_round_task

DIGEST_BYTES = 32
NONCE_MAX = MAX_SESSION_ID_BYTES - DIGEST_BYTES
_TASK_LABEL = b"fedmask/round-task/v1"
_TRAINING_LABEL = b"fedmask/training-key/v1"


def _field(h: Any, data: bytes) -> None:
    """Length-prefixed, so that no two field sequences hash alike."""
    h.update(struct.pack(">Q", len(data)))
    h.update(data)


def _parameters(h: Any, params: common_pb2.ModelParameters) -> None:
    """Each named tensor by name (their order carries no meaning): name, dtype, shape, bytes."""
    _field(h, struct.pack(">Q", len(params.tensors)))
    for nt in sorted(params.tensors, key=lambda nt: nt.name):
        t = nt.tensor
        _field(h, nt.name.encode())
        _field(h, struct.pack(">I", int(t.dtype)))
        _field(h, struct.pack(f">{len(t.shape)}Q", *(int(d) for d in t.shape)))
        _field(h, bytes(t.data))


def _dp_training(h: Any, dp: session_pb2.DpSettings) -> None:
    _field(h, struct.pack(">Idd", int(dp.mode), float(dp.clip_norm), float(dp.noise_multiplier)))


def task_digest(task: session_pb2.RoundTask) -> bytes:
    """SHA-256 over the parts of `task` common to every client of its round."""
    h = hashlib.sha256(_TASK_LABEL)
    _field(h, struct.pack(">Q", int(task.round_number)))
    _field(h, task.model_name.encode())
    _field(h, struct.pack(">Q", int(task.model_version)))
    _parameters(h, task.global_parameters)
    _field(h, task.hyperparameters_json.encode())
    _field(h, task.secagg.SerializeToString(deterministic=True))
    _dp_training(h, task.dp)
    _field(h, struct.pack(">d", float(task.dp.noise_stddev)))
    # the discrete Gaussian's mechanism, share and encoding (D88)
    _field(h, struct.pack(">IQQdQ", int(task.dp.mechanism), int(task.dp.noise_variance_numerator),
                          int(task.dp.noise_variance_denominator), float(task.dp.scale), int(task.dp.update_length)))
    _field(h, "\n".join(task.metric_names).encode())
    _field(h, b"".join(struct.pack(">QI", int(p.device_id), int(p.secagg_id)) for p in task.cohort))
    return h.digest()


def training_key(task: session_pb2.RoundTask) -> bytes:
    """SHA-256 over what a device's update is computed from: the model, its
    parameters, the hyper-parameters (the curriculum step among them) and the
    DP mode, clip and multiplier (not the mechanism, see the module doc).
    Two rounds with the same key differ only in who else takes part, which
    is what differencing two sums exploits."""
    h = hashlib.sha256(_TRAINING_LABEL)
    _field(h, task.model_name.encode())
    _parameters(h, task.global_parameters)
    _field(h, task.hyperparameters_json.encode())
    _dp_training(h, task.dp)
    return h.digest()


def binding_refusal(task: session_pb2.RoundTask) -> str | None:
    """Device side: None when the task's session id is a nonce followed by
    `task_digest(task)`; otherwise why the device refuses the round."""
    sid = bytes(task.session_id)
    if not DIGEST_BYTES < len(sid) <= MAX_SESSION_ID_BYTES:
        return "the round's session id does not commit to its task"
    if sid[-DIGEST_BYTES:] != task_digest(task):
        return "the round's session id does not match the task this device received (model or task differs)"
    return None


def bind_round_config(
    config: SecAggConfig,
    *,
    round_number: int,
    ids: RoundIds,
    model_name: str,
    model_version: int,
    global_parameters: common_pb2.ModelParameters | Mapping[str, np.ndarray],
    hyperparameters: Mapping[str, Any] | None = None,
    dp: session_pb2.DpSettings | None = None,
    metrics: MetricLayout = EMPTY_LAYOUT,
) -> SecAggConfig:
    """Coordinator side: `config` with session id nonce || task_digest, where
    the nonce is config's own session id (at most NONCE_MAX bytes). Build the
    round's machine and every client's task (`build_round_task`, with the
    same arguments) from the config returned."""
    nonce = config.session_id
    if not 1 <= len(nonce) <= NONCE_MAX:
        raise ValueError(f"a session nonce is 1..{NONCE_MAX} bytes")
    template = build_round_task(
        config=config, round_number=round_number, ids=ids, devices=(), model_name=model_name,
        model_version=model_version, global_parameters=global_parameters, hyperparameters=hyperparameters,
        dp=dp, metrics=metrics,
    )
    return dataclasses.replace(config, session_id=nonce + task_digest(template))


def cohort_ids(cohort: Sequence[int]) -> RoundIds:
    """The RoundIds a round over `cohort` uses (as the coordinator's machine does)."""
    return RoundIds.from_cohort(list(cohort))


__all__ = ["DIGEST_BYTES", "NONCE_MAX", "bind_round_config", "binding_refusal", "cohort_ids", "task_digest",
           "training_key"]
