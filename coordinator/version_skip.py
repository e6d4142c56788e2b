"""Moving past a model version that a dead coordinator spent (D94).

A coordinator that dies after asking a cohort to unmask (a leader killed,
a host lost) leaves devices that answered, and so spent their contribution
to the version's training key (D85), and a round that can never commit:
the answers went to a process that is gone. Its successor finds the round
in the store (saved before the requests went out, `unmasking_guard`) and
counts every device asked as spent (`spent_devices`). When those devices
are what keeps selection from forming a cohort, waiting for devices that
have not contributed (D85's rule for a round a live coordinator saw abort)
would hold the federation until new devices enrol: forever where the cohort
is the population.

So the leader moves past the version instead: it stores a new version with
the same parameters at the next step (`step + 1`, hyper-parameters
`skip_of` = the spent version and `skipped_rounds` = the rounds that spent
it), as a round whose update was zero would have, and makes it current. Its
training key differs (the task's round index is the step), so every device
may contribute to it once, as to any new version; no device is asked again
for a key it has answered. The version's lineage says it is a skip, its
step follows the last one (the history keeps no gap and no duplicate step),
and the write is fenced by the leader's lease like a commit. The skipped
rounds produced no version, but each is in the privacy ledger: the dead
coordinator may have unmasked its sum, so the start-up that aborted it
charged it as released (`interrupted_charge`, D94).

A skip happens only when selection has waited one selection window
(`deadlines.selection`, for devices that reconnect after the failover)
with fewer eligible devices than the cohort minimum, and the devices spent
by rounds a dead coordinator left, added back, would reach the minimum.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from coordinator.current_model import CurrentModel
from coordinator.logs import log_event
from coordinator.model_host import ServerModel
from coordinator.spent_devices import SpentDevices
from coordinator.store import NewModelVersion, Store
from coordinator.store.blobs import pack_parameters

#: Hyper-parameters of a skip version: the version it moves past, and the rounds that spent it.
SKIP_OF = "skip_of"
SKIPPED_ROUNDS = "skipped_rounds"


def should_skip(spent: SpentDevices, available: Iterable[int], *, eligible: int, minimum: int) -> bool:
    """Whether the devices spent by rounds a dead coordinator left are what
    keeps `eligible` below `minimum` (see the module doc)."""
    if eligible >= minimum or not spent.interrupted:
        return False
    blocked = set(available) & frozenset().union(*spent.interrupted.values())
    return eligible + len(blocked) >= minimum


async def skip_version(store: Store, current: CurrentModel, model: ServerModel, spent: SpentDevices) -> int | None:
    """Store and adopt the skip version of the current one (see the module
    doc); its id, or None when the current version changed meanwhile (a
    commit or a rollback moved the federation already)."""
    async with current.lock:
        spent_version = current.version
        if spent_version is None or spent_version != spent.version:
            return None
        rounds = sorted(spent.interrupted)
        step = current.step + 1
        version = NewModelVersion(model_name=model.name, parameters=pack_parameters(current.parameters),
                                  hyperparameters={**model.hyperparameters(), "step": step, SKIP_OF: spent_version,
                                                   SKIPPED_ROUNDS: rounds})
        summary = await asyncio.to_thread(store.add_model_version, version)
        current.adopt(summary.id, current.parameters, step)
    log_event("version_skipped", logging.WARNING, spent_version=spent_version, version=summary.id, step=step,
              rounds=",".join(map(str, rounds)),
              why="a coordinator died after asking for unmasking: its devices spent the version (D85, D94)")
    return summary.id


class VersionSkip:
    """The round loop's skip: `step` while selection waits (see the module doc)."""

    def __init__(self, store: Store, current: CurrentModel, model: ServerModel, *, grace_s: float,
                 clock: Callable[[], float]) -> None:
        self._store, self._current, self._model = store, current, model
        self._grace_s = grace_s
        self._clock = clock
        self._since: tuple[int | None, float] | None = None  # (version, when the devices it spent began to block)

    async def step(self, spent: SpentDevices, available: Iterable[int], *, eligible: int, minimum: int) -> bool:
        """True when it stored and adopted a skip version (refresh the
        exclusions); False: wait for devices as before."""
        if not should_skip(spent, available, eligible=eligible, minimum=minimum):
            self._since = None
            return False
        now = self._clock()
        if self._since is None or self._since[0] != spent.version:
            self._since = (spent.version, now)
        if now - self._since[1] < self._grace_s:
            return False
        self._since = None
        return await skip_version(self._store, self._current, self._model, spent) is not None


__all__ = ["SKIPPED_ROUNDS", "SKIP_OF", "VersionSkip", "should_skip", "skip_version"]
