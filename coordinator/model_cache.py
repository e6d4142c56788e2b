"""The parameters of stored model versions, as a replica's group tasks
carry them: each version read from the store and encoded for the RoundTask
once (`wire.params_to_proto`), the last few kept.

`ModelCache.task_fields(plan, dp, metrics)` gives the `TaskFields` of one
group of a planned round: the plan's model (name, version) and
hyper-parameters as the leader sent them, the version's parameters, the
group's DpSettings and the round's metric layout. Blocking (a store read,
the encoding): call it in a worker thread. Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from coordinator.round_tasks import TaskFields
from coordinator.store import Store
from coordinator.store.blobs import unpack_parameters
from coordinator.store.group_records import RoundPlan
from fedmask_proto.v1 import common_pb2, session_pb2
from wire import params_to_proto
from wire.round_metrics import MetricLayout


class ModelMismatch(ValueError):
    """The stored version is of another model than the plan names."""


class ModelCache:
    """See the module doc; keeps the `keep` most recently used versions."""

    def __init__(self, store: Store, *, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError("keep at least one version")
        self._store = store
        self._keep = keep
        self._lock = threading.Lock()
        self._versions: OrderedDict[int, tuple[str, common_pb2.ModelParameters]] = OrderedDict()
        self.loads = 0  # store reads so far (one per version while it stays cached)

    def parameters(self, version: int) -> tuple[str, common_pb2.ModelParameters]:
        """Stored version `version`'s model name and its parameters as a
        RoundTask carries them. NotFoundError (the store's) for no such
        version."""
        with self._lock:
            hit = self._versions.get(version)
            if hit is not None:
                self._versions.move_to_end(version)
                return hit
        stored = self._store.get_model_version(version)
        entry = (stored.model_name, params_to_proto(unpack_parameters(stored.parameters)))
        with self._lock:
            self.loads += 1
            self._versions[version] = entry
            self._versions.move_to_end(version)
            while len(self._versions) > self._keep:
                self._versions.popitem(last=False)
        return entry

    def task_fields(self, plan: RoundPlan, dp: session_pb2.DpSettings, metrics: MetricLayout) -> TaskFields:
        """The TaskFields of a group of `plan` with DpSettings `dp` (the
        module doc). ModelMismatch when the version is of another model."""
        name, params = self.parameters(plan.model_version)
        if name != plan.model_name:
            raise ModelMismatch(f"model version {plan.model_version} is of {name!r}, the plan names "
                                f"{plan.model_name!r}")
        return TaskFields(model_name=plan.model_name, model_version=plan.model_version, global_parameters=params,
                          hyperparameters=dict(plan.hyperparameters), dp=dp, metrics=metrics)


__all__ = ["ModelCache", "ModelMismatch"]
