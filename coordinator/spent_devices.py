"""Devices the honest coordinator does not select: those that may already
have contributed to the current model and task (D85).

A device contributes to a given training key (model, parameters, curriculum
step, DP settings: `wire.round_binding.training_key`) at most once, and it
spends that contribution when it answers a round's unmasking request, even
if the round then aborts (a malicious coordinator could fake the abort after
it got the shares). Such a device refuses every later round on the same
model version with "already contributed". Selecting it would only cost a
round: with enough of them in a cohort the round aborts, and the next one on
the same version would select them again. So the honest coordinator leaves
them out, deriving the set from the store's round records (not from memory),
so that it holds across restarts and with several replicas on one store:

    spent = the unmasking responders of every round (committed, aborted or
            in progress) whose base model version trains the same parameters
            and step as the current version: the current version and the
            versions it is a rollback of (`hyperparameters["rollback_of"]`).

A round's unmasking responders (`unmasking_responders`) are the devices its
record lists under `survivors["unmasking"]` (secagg's server records each
accepted answer as it arrives, so a round cancelled during unmasking lists
them too). A round interrupted by a coordinator crash (aborted
`coordinator_restart`) or still in progress may have been saved before its
answers arrived: for it, every device asked to unmask counts, i.e. the
survivors of its last stage before unmasking (consistency_check in active
mode, else masked_input). That over-counts the devices that never answered,
and, in active mode, a round interrupted during the consistency check: the
price of never selecting a spent device.

Selection then waits, as it does for too few devices, until the model
changes (a commit) or devices that have not contributed connect; the
coordinator logs why, once per model version and count
(`selection_waiting ... spent=N`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Iterable

from coordinator.logs import log_event
from coordinator.store import COORDINATOR_RESTART, NotFoundError, RoundRecord, Store

UNMASKING = "unmasking"
#: The stage whose survivors get the unmasking requests (active, passive mode).
ASKED_FROM = ("consistency_check", "masked_input")
PAGE = 200


def unmasking_responders(record: RoundRecord) -> frozenset[int]:
    """The devices that may have answered `record`'s unmasking request (see the module doc)."""
    out = set(record.survivors.get(UNMASKING, ()))
    interrupted = not record.state.is_terminal or record.abort_reason == COORDINATOR_RESTART
    if interrupted:
        for stage in ASKED_FROM:
            if stage in record.survivors:
                out.update(record.survivors[stage])
                break
    return frozenset(out)


def spent_devices(records: Iterable[RoundRecord], versions: Collection[int]) -> frozenset[int]:
    """The unmasking responders of the rounds based on one of `versions`."""
    out: set[int] = set()
    for r in records:
        if r.base_model_version is not None and r.base_model_version in versions:
            out |= unmasking_responders(r)
    return frozenset(out)


def same_training_versions(version: int, rollback_of: Callable[[int], int | None], *, limit: int = 64) -> frozenset[int]:
    """`version` and the versions it is a rollback of, transitively (a
    rollback stores the old parameters and step as a new version)."""
    out = {version}
    v: int | None = version
    while v is not None and len(out) < limit:
        v = rollback_of(v)
        if v is None or v in out:
            break
        out.add(v)
    return frozenset(out)


def rollback_chain(store: Store, version: int) -> frozenset[int]:
    """Blocking: `same_training_versions` of `version` from the store."""

    def rollback_of(v: int) -> int | None:
        try:
            old = store.get_model_version(v).hyperparameters.get("rollback_of")
        except NotFoundError:
            return None
        return int(old) if isinstance(old, int) else None

    return same_training_versions(version, rollback_of)


def rounds_on(store: Store, versions: Collection[int]) -> list[RoundRecord]:
    """Blocking: the rounds based on one of `versions` (pages the rounds
    newest first, down to the oldest of `versions`: rounds are numbered in
    time order, and a version's rounds come after it)."""
    oldest = min(versions)
    out: list[RoundRecord] = []
    before: int | None = None
    while True:
        page = store.list_rounds(limit=PAGE, before=before)
        out += [r for r in page.items if r.base_model_version is not None and r.base_model_version in versions]
        last = page.items[-1] if page.items else None
        if last is None or page.next_cursor is None:
            break
        if last.base_model_version is not None and last.base_model_version < oldest:
            break
        before = page.next_cursor
    return out


def read_spent(store: Store, versions: Collection[int]) -> frozenset[int]:
    """Blocking: the spent devices of the rounds based on `versions`."""
    return spent_devices(rounds_on(store, versions), versions)


def left_by_a_dead_coordinator(records: Iterable[RoundRecord]) -> dict[int, frozenset[int]]:
    """Round number -> the devices it spent, for the rounds a coordinator
    left when it died after asking for unmasking (aborted
    `coordinator_restart` by its successor, or still in progress): what
    `version_skip` moves past (D94)."""
    out: dict[int, frozenset[int]] = {}
    for r in records:
        if r.state.is_terminal and r.abort_reason != COORDINATOR_RESTART:
            continue
        spent = unmasking_responders(r)
        if spent:
            out[r.number] = spent
    return out


class SpentDevices:
    """The coordinator's view of the spent devices (refresh before each
    selection, also while it waits) and its one log line per wait."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.devices: frozenset[int] = frozenset()
        self._version: int | None = None
        self._logged: tuple[int | None, int, int] | None = None
        self._versions: frozenset[int] = frozenset()
        #: round number -> devices it spent, for the rounds on this version a dead coordinator left (D94)
        self.interrupted: dict[int, frozenset[int]] = {}

    @property
    def version(self) -> int | None:
        """The model version the sets were read for."""
        return self._version

    async def refresh(self, version: int | None) -> None:
        """Reread the spent set for the current model `version` (empty with no version)."""
        if version is None:
            self._version, self.devices, self.interrupted = None, frozenset(), {}
            return
        if version != self._version or not self._versions:  # a version's rollback chain never changes
            self._versions = await asyncio.to_thread(rollback_chain, self.store, version)
            self._version = version
        records = await asyncio.to_thread(rounds_on, self.store, self._versions)
        self.devices = spent_devices(records, self._versions)
        self.interrupted = left_by_a_dead_coordinator(records)

    def waiting(self, available: Iterable[int], *, eligible: int, minimum: int) -> None:
        """Selection waits with `eligible` < `minimum`: say, once per model
        version and count, how many available devices are left out as spent."""
        spent = len(self.devices.intersection(available))
        key = (self._version, spent, minimum)
        if spent and key != self._logged:
            log_event("selection_waiting", logging.WARNING, eligible=eligible, minimum=minimum, spent=spent,
                      version=self._version,
                      why="devices that answered an unmasking request on this model version refuse it (D85)")
            self._logged = key


__all__ = ["SpentDevices", "left_by_a_dead_coordinator", "read_spent", "rounds_on", "rollback_chain", "same_training_versions", "spent_devices", "unmasking_responders"]
