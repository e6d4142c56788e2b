"""In-memory Store: for unit tests and single-process simulations.

Same contract as the SQL store (coordinator.store.interface). Atomicity:
every mutating method works on staged copies and publishes them with one
assignment at the end, so an exception half-way leaves nothing behind.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from coordinator.store.errors import (
    ConflictError,
    CorruptBlobError,
    EnrollmentConflictError,
    InvalidRecordError,
    NotFoundError,
)
from coordinator.store.lease_records import Lease
from coordinator.store.group_records import ChargeRule, merged_unmasking
from coordinator.store.memory_groups import InMemoryRoundGroups
from coordinator.store.memory_lease import InMemoryLeaderLease
from coordinator.store.memory_replicas import InMemoryReplicas
from coordinator.store.memory_reports import InMemoryShareReports
from coordinator.store.records import (
    COORDINATOR_RESTART,
    AuditRecord,
    DeviceRecord,
    DeviceStatus,
    ModelVersion,
    ModelVersionSummary,
    NewModelVersion,
    Page,
    PrivacyEntry,
    PrivacySummary,
    RoundRecord,
    RoundState,
    sha256_hex,
    check_audit_fields,
    utc_now,
)
from coordinator.store.summaries import (
    check_audit_details,
    check_charge,
    check_commit_args,
    check_enrollment_batch,
    enrollment_refusal,
    page_of,
    summarize_privacy,
    validate_limit,
)


@dataclass(slots=True)
class _State:
    devices: dict[int, DeviceRecord]
    models: dict[int, ModelVersion]
    rounds: dict[int, RoundRecord]
    ledger: dict[int, PrivacyEntry]
    #: the last number next_round_number handed out
    last_round_number: int = 0
    audit: list[AuditRecord] = field(default_factory=list)

    def copy(self) -> _State:
        return _State(
            dict(self.devices), dict(self.models), dict(self.rounds), dict(self.ledger), self.last_round_number,
            list(self.audit),
        )


class InMemoryStore(InMemoryShareReports, InMemoryLeaderLease, InMemoryReplicas, InMemoryRoundGroups):
    """A Store held in process memory; lost when the process ends (share
    reports and quarantines: the InMemoryShareReports mixin; the leader
    lease: InMemoryLeaderLease; replica membership and stream ownership:
    InMemoryReplicas, on the lease's clock; round plans and groups:
    InMemoryRoundGroups, which the terminal writes seal)."""

    def __init__(self, *, clock: Callable[[], datetime] = utc_now,
                 lease_clock: Callable[[], float] = time.monotonic) -> None:
        InMemoryShareReports.__init__(self)
        InMemoryLeaderLease.__init__(self, lease_clock)
        InMemoryReplicas.__init__(self, lease_clock)
        InMemoryRoundGroups.__init__(self)
        self._clock = clock
        self._lock = threading.RLock()
        self._state = _State({}, {}, {}, {})

    # ------------------------------------------------------------ devices
    def enroll_devices(
        self, devices: Sequence[tuple[bytes, str]], *, client_id: str | None = None
    ) -> list[tuple[DeviceRecord, bool]]:
        keys = check_enrollment_batch(devices)
        with self._lock:
            by_key = {d.identity_public_key: d for d in self._state.devices.values()}
            for i, key in enumerate(keys):
                found = by_key.get(key)
                if found is not None:
                    reason = enrollment_refusal(found.status, found.client_id, client_id)
                    if reason is not None:
                        raise EnrollmentConflictError(i, found.id, reason)
            by_handle = {d.local_id: d for d in self._state.devices.values() if d.local_id}
            for i, (key, (_, local_id)) in enumerate(zip(keys, devices, strict=True)):
                holder = by_handle.get(local_id) if local_id and key not in by_key else None
                if holder is not None:
                    raise EnrollmentConflictError(i, holder.id, EnrollmentConflictError.HANDLE_TAKEN)
            staged = self._state.copy()
            enrolled_at = self._clock()
            out: list[tuple[DeviceRecord, bool]] = []
            for key, (_, local_id) in zip(keys, devices, strict=True):
                if key in by_key:
                    out.append((by_key[key], False))
                    continue
                record = DeviceRecord(
                    id=max(staged.devices, default=0) + 1,
                    identity_public_key=key,
                    enrolled_at=enrolled_at,
                    status=DeviceStatus.ACTIVE,
                    local_id=local_id,
                    client_id=client_id,
                )
                staged.devices[record.id] = record
                out.append((record, True))
            self._state = staged  # publish: all devices or none
            return out

    def enroll_device(
        self, identity_public_key: bytes, *, local_id: str = "", client_id: str | None = None
    ) -> tuple[DeviceRecord, bool]:
        return self.enroll_devices([(identity_public_key, local_id)], client_id=client_id)[0]

    def _enrolled_devices(self, device_ids: Iterable[int]) -> set[int]:
        """Those of `device_ids` that are enrolled (for InMemoryReplicas)."""
        with self._lock:
            return {d for d in device_ids if d in self._state.devices}

    def get_device(self, device_id: int) -> DeviceRecord | None:
        with self._lock:
            return self._state.devices.get(device_id)

    def get_device_by_local_id(self, local_id: str) -> DeviceRecord | None:
        if not local_id:
            return None
        with self._lock:
            return next((d for d in self._state.devices.values() if d.local_id == local_id), None)

    def list_devices(self, *, status: DeviceStatus | None = None) -> list[DeviceRecord]:
        with self._lock:
            return [
                d for _, d in sorted(self._state.devices.items()) if status is None or d.status == status
            ]

    def count_devices(self) -> dict[DeviceStatus, int]:
        with self._lock:
            return dict(Counter(d.status for d in self._state.devices.values()))

    def mark_devices_seen(self, device_ids: Iterable[int], at: datetime | None = None) -> None:
        when = at or self._clock()
        with self._lock:
            staged = self._state.copy()
            for device_id in device_ids:
                if device_id in staged.devices:
                    staged.devices[device_id] = replace(staged.devices[device_id], last_seen_at=when)
            self._state = staged

    def set_device_status(self, device_id: int, status: DeviceStatus) -> DeviceRecord:
        with self._lock:
            if device_id not in self._state.devices:
                raise NotFoundError(f"device {device_id} is not enrolled")
            staged = self._state.copy()
            staged.devices[device_id] = replace(staged.devices[device_id], status=DeviceStatus(status))
            self._state = staged
            return staged.devices[device_id]

    # ------------------------------------------------------ model versions
    def _new_model(self, staged: _State, version: NewModelVersion, round_number: int | None) -> ModelVersion:
        model = ModelVersion(
            id=max(staged.models, default=0) + 1,
            round_number=round_number,
            created_at=version.created_at or self._clock(),
            model_name=version.model_name,
            sha256=sha256_hex(version.parameters),
            size_bytes=len(version.parameters),
            hyperparameters=copy.deepcopy(dict(version.hyperparameters)),
            parameters=version.parameters,
        )
        staged.models[model.id] = model
        return model

    def add_model_version(self, version: NewModelVersion, *, fence: Lease | None = None) -> ModelVersionSummary:
        with self._lease_lock, self._lock:
            self._check_fence(fence)
            staged = self._state.copy()
            model = self._new_model(staged, version, None)
            self._state = staged
            return model.summary()

    def latest_model_version(self, model_name: str | None = None) -> ModelVersion | None:
        with self._lock:
            for _, model in sorted(self._state.models.items(), reverse=True):
                if model_name is None or model.model_name == model_name:
                    return _verified(model)
            return None

    def get_model_version(self, version_id: int) -> ModelVersion:
        with self._lock:
            model = self._state.models.get(version_id)
        if model is None:
            raise NotFoundError(f"model version {version_id} does not exist")
        return _verified(model)

    def list_model_versions(self, *, limit: int = 50, before: int | None = None) -> Page[ModelVersionSummary]:
        validate_limit(limit)
        with self._lock:
            ids = sorted((i for i in self._state.models if before is None or i < before), reverse=True)
            items = tuple(self._state.models[i].summary() for i in ids[: limit + 1])
        return page_of(items, limit, key=lambda m: m.id)

    # -------------------------------------------------------------- rounds
    def next_round_number(self) -> int:
        with self._lock:
            number = max(max(self._state.rounds, default=0), self._state.last_round_number) + 1
            staged = self._state.copy()
            staged.last_round_number = number
            self._state = staged
            return number

    def _check_writable(self, record: RoundRecord) -> None:
        stored = self._state.rounds.get(record.number)
        if stored is not None and stored.state.is_terminal:
            raise ConflictError(f"round {record.number} is already {stored.state}")

    def _stored_round(self, number: int) -> RoundRecord | None:
        """The stored round (for InMemoryRoundGroups; the caller holds the lock)."""
        return self._state.rounds.get(number)

    def _models(self) -> Mapping[int, ModelVersion]:
        return self._state.models

    def _stage_round(self, record: RoundRecord) -> Callable[[], None]:
        """Check `record` writable (ConflictError) and return what publishes it."""
        self._check_writable(record)
        staged = self._state.copy()
        staged.rounds[record.number] = _copy_round(record)

        def publish() -> None:
            self._state = staged

        return publish

    def save_round_progress(self, record: RoundRecord) -> None:
        if record.state.is_terminal:
            raise InvalidRecordError(f"save_round_progress got terminal state {record.state}")
        with self._lock:
            self._check_writable(record)
            staged = self._state.copy()
            staged.rounds[record.number] = _copy_round(record)
            self._state = staged

    def commit_round(
        self,
        round_record: RoundRecord,
        new_model_version: NewModelVersion,
        privacy_entry: PrivacyEntry | None,
        *,
        fence: Lease | None = None,
    ) -> ModelVersionSummary:
        check_commit_args(round_record, privacy_entry)
        with self._lease_lock, self._lock:
            self._check_fence(fence)
            self._check_writable(round_record)
            if privacy_entry is not None and round_record.number in self._state.ledger:
                raise ConflictError(f"round {round_record.number} already has a privacy entry")
            staged = self._state.copy()
            staged.rounds[round_record.number] = _copy_round(round_record)
            model = self._new_model(staged, new_model_version, round_record.number)
            if privacy_entry is not None:
                self._insert_privacy_entry(staged, privacy_entry)
            tables, _ = self._sealing({round_record.number: model.id})
            self._state = staged  # publish: the only visible writes
            self._publish_groups(tables)
            return model.summary()

    @staticmethod
    def _insert_privacy_entry(staged: _State, entry: PrivacyEntry) -> None:
        staged.ledger[entry.round_number] = entry

    def abort_round(self, round_record: RoundRecord, *, fence: Lease | None = None,
                    privacy_entry: PrivacyEntry | None = None) -> None:
        if round_record.state is not RoundState.ABORTED:
            raise InvalidRecordError(f"abort_round got state {round_record.state}")
        with self._lease_lock, self._lock:
            self._check_fence(fence)
            self._check_writable(round_record)
            entry = check_charge(privacy_entry, round_record.number, self._state.ledger)
            staged = self._state.copy()
            staged.rounds[round_record.number] = _copy_round(round_record)
            if entry is not None:
                self._insert_privacy_entry(staged, entry)
            tables, _ = self._sealing({round_record.number: None})
            self._state = staged
            self._publish_groups(tables)

    def mark_interrupted_rounds_aborted(self, *, at: datetime | None = None, charge: ChargeRule | None = None,
                                        fence: Lease | None = None) -> list[int]:
        when = at or self._clock()
        with self._lease_lock, self._lock:
            self._check_fence(fence)
            staged = self._state.copy()
            numbers = sorted(n for n, r in staged.rounds.items() if not r.state.is_terminal)
            tables, groups = self._sealing(dict.fromkeys(numbers))
            for n in numbers:
                found = staged.rounds[n]
                staged.rounds[n] = replace(found, state=RoundState.ABORTED, abort_reason=COORDINATOR_RESTART,
                                           ended_at=when, survivors=merged_unmasking(found.survivors, groups[n]))
                if charge is not None:
                    ledger = [e for _, e in sorted(staged.ledger.items())]
                    charged = check_charge(charge(_copy_round(found), ledger, groups[n]), n, staged.ledger)
                    if charged is not None:
                        self._insert_privacy_entry(staged, charged)
            self._state = staged
            self._publish_groups(tables)
            return numbers

    def get_round(self, number: int) -> RoundRecord | None:
        with self._lock:
            record = self._state.rounds.get(number)
        return None if record is None else _copy_round(record)

    def list_rounds(self, *, limit: int = 50, before: int | None = None) -> Page[RoundRecord]:
        validate_limit(limit)
        with self._lock:
            numbers = sorted((n for n in self._state.rounds if before is None or n < before), reverse=True)
            items = tuple(_copy_round(self._state.rounds[n]) for n in numbers[: limit + 1])
        return page_of(items, limit, key=lambda r: r.number)

    # ------------------------------------------------------------- privacy
    def privacy_ledger(self) -> list[PrivacyEntry]:
        with self._lock:
            return [e for _, e in sorted(self._state.ledger.items())]

    def privacy_summary(self) -> PrivacySummary:
        return summarize_privacy(self.privacy_ledger())

    # ----------------------------------------------------------- audit log
    def append_audit(
        self, *, operator: str, action: str, outcome: str,
        details: Mapping[str, Any] | None = None, at: datetime | None = None,
    ) -> AuditRecord:
        check_audit_fields(operator, action, outcome)
        clean = check_audit_details(details)
        with self._lock:
            staged = self._state.copy()
            entry = AuditRecord(id=len(staged.audit) + 1, at=at or self._clock(), operator=operator, action=action,
                               outcome=outcome, details=clean)
            staged.audit.append(entry)
            self._state = staged
            return replace(entry)

    def list_audit(self, *, limit: int = 50, before: int | None = None) -> Page[AuditRecord]:
        validate_limit(limit)
        with self._lock:
            newest = [e for e in reversed(self._state.audit) if before is None or e.id < before]
            items = tuple(replace(e) for e in newest[: limit + 1])
        return page_of(items, limit, key=lambda e: e.id)

    def close(self) -> None:
        """Nothing to release."""


def _copy_round(record: RoundRecord) -> RoundRecord:
    # RoundRecord's constructor copies its mappings.
    return replace(record)



def _verified(model: ModelVersion) -> ModelVersion:
    actual = sha256_hex(model.parameters)
    if actual != model.sha256:
        raise CorruptBlobError(model.id, model.sha256, actual)
    return replace(model, hyperparameters=copy.deepcopy(dict(model.hyperparameters)))

