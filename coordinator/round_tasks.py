"""The RoundTasks of one round, bound to what they carry.

`TaskFields.for_round(...)` fixes, once per round, what every client's
RoundTask carries alike: the model's name, version and parameters, the
hyper-parameters (the curriculum step among them), the DP settings and the
metric names. `bind(config, number, cohort)` gives the round's SecAggConfig
whose session id commits to those fields (`wire.round_binding`: nonce ||
task digest; the devices check it and refuse a task that does not match, so
the coordinator cannot send different models to different devices of one
round), and `task(r, devices, deadlines)` builds one client's task from the
same fields. Hashing the parameters is blocking work: run `bind` in a thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from coordinator.current_model import CurrentModel
from coordinator.model_host import ServerModel
from coordinator.round_policy import dp_settings_for, task_hyperparameters
from coordinator.rounds import RoundMachine
from coordinator.settings import CoordinatorSettings
from dpmech.mechanism import MechanismConfig
from fedmask_proto.v1 import common_pb2, session_pb2
from secagg.config import SecAggConfig
from wire import build_round_task
from wire.round_binding import bind_round_config, cohort_ids
from wire.round_metrics import MetricLayout


@dataclass(frozen=True)
class TaskFields:
    model_name: str
    model_version: int
    global_parameters: common_pb2.ModelParameters
    hyperparameters: dict[str, Any]
    dp: session_pb2.DpSettings
    metrics: MetricLayout

    @classmethod
    def for_round(cls, settings: CoordinatorSettings, model: ServerModel, current: CurrentModel,
                  model_version: int, cohort_size: int, metrics: MetricLayout,
                  mechanism: MechanismConfig | None = None, *, rotation_key: bytes = b"") -> TaskFields:
        """The round's fields; `mechanism`: its discrete Gaussian (D88), when
        DP runs with it; `rotation_key`: its rotation's key in a round in
        groups (D99)."""
        return cls(model_name=model.name, model_version=model_version, global_parameters=current.proto(),
                   hyperparameters=task_hyperparameters(settings, model.hyperparameters(), current.step),
                   dp=dp_settings_for(settings.dp, cohort_size, mechanism, rotation_key=rotation_key),
                   metrics=metrics)

    def _common(self) -> dict[str, Any]:
        return {"model_name": self.model_name, "model_version": self.model_version,
                "global_parameters": self.global_parameters, "hyperparameters": self.hyperparameters,
                "dp": self.dp, "metrics": self.metrics}

    def bind(self, config: SecAggConfig, number: int, cohort: Sequence[int]) -> SecAggConfig:
        """The round's config, its session id bound to these fields (blocking)."""
        return bind_round_config(config, round_number=number, ids=cohort_ids(cohort), **self._common())

    def task(self, r: RoundMachine, devices: Sequence[int], deadlines: dict[str, float]) -> session_pb2.RoundTask:
        """The RoundTask of the client hosting `devices` (r.config from `bind`)."""
        return build_round_task(config=r.config, round_number=r.number, ids=r.ids, devices=devices,
                                deadlines=deadlines, **self._common())


__all__ = ["TaskFields"]
