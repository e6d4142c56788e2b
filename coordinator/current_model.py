"""The global model the coordinator serves now: its parameters, their proto
(built once per version, for the RoundTasks), its store version and its
step (the number of committed updates it has had).

A commit (service.py) and a rollback (operator_actions.py) replace it under
`lock`, so the two never interleave (D44). Runs on the coordinator's event
loop; store calls go to worker threads.
"""

from __future__ import annotations

import asyncio

import numpy as np

from coordinator.logs import log_event
from coordinator.model_host import ServerModel
from coordinator.store import NewModelVersion, Store
from coordinator.store.blobs import pack_parameters, unpack_parameters
from fedmask_proto.v1 import common_pb2
from wire import params_to_proto


class CurrentModel:
    """See the module doc. Empty (version None) until `load`."""

    def __init__(self, store: Store, model: ServerModel) -> None:
        self._store = store
        self._model = model
        self.parameters: dict[str, np.ndarray] = {}
        self.version: int | None = None
        self.step = 0
        self.lock = asyncio.Lock()  # a commit and a rollback never interleave
        self._proto: common_pb2.ModelParameters | None = None

    async def load(self, seed: int) -> None:
        """Resume from the store's latest version of the model, or initialize
        it from `seed` and store it as the first version. ValueError when the
        stored parameters do not have the configured model's shapes."""
        model = self._model
        latest = await asyncio.to_thread(self._store.latest_model_version, model.name)
        want = model.parameter_shapes()
        if latest is None:
            params = model.init_parameters(seed)
            summary = await asyncio.to_thread(
                self._store.add_model_version,
                NewModelVersion(model_name=model.name, parameters=pack_parameters(params),
                                hyperparameters={**model.hyperparameters(), "step": 0}),
            )
            self.adopt(summary.id, params, 0)
            log_event("model_initialized", model=model.name, version=summary.id)
            return
        params = unpack_parameters(latest.parameters)
        got = {k: tuple(v.shape) for k, v in params.items()}
        if got != want:
            raise ValueError(
                f"stored model version {latest.id} of {model.name!r} has parameters {got}, "
                f"but the configured model has {want}: use another database or matching hyperparameters"
            )
        self.adopt(latest.id, params, int(latest.hyperparameters.get("step", 0)))
        log_event("model_resumed", model=model.name, version=latest.id, step=self.step)

    def adopt(self, version: int, parameters: dict[str, np.ndarray], step: int) -> None:
        """Make stored version `version` (these parameters, this step) current."""
        self.parameters, self._proto = parameters, None
        self.version = version
        self.step = step

    async def stepped(self, mean: np.ndarray) -> tuple[dict[str, np.ndarray], NewModelVersion]:
        """The parameters after the model's server step with a round's
        decoded `mean` (in a worker thread), and the version to store for
        them (step + 1); nothing changes until `adopt`."""
        params = await asyncio.to_thread(self._model.apply_mean, self.parameters, mean, self.step)
        return params, NewModelVersion(model_name=self._model.name, parameters=pack_parameters(params),
                                       hyperparameters={**self._model.hyperparameters(), "step": self.step + 1})

    def proto(self) -> common_pb2.ModelParameters:
        """The parameters as the RoundTask carries them (built once per version)."""
        if self._proto is None:
            self._proto = params_to_proto(self.parameters)
        return self._proto


__all__ = ["CurrentModel"]
