"""Pure helpers shared by the Store implementations."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from coordinator.store.errors import ConflictError, EnrollmentConflictError, InvalidRecordError
from coordinator.store.records import DeviceStatus, Page, PrivacyEntry, PrivacySummary, RoundRecord, RoundState

T = TypeVar("T")

MAX_PAGE = 1000


def check_commit_args(record: RoundRecord, entry: PrivacyEntry | None) -> None:
    """What `Store.commit_round` requires of its arguments (InvalidRecordError)."""
    if record.state is not RoundState.COMMITTED:
        raise InvalidRecordError(f"commit_round got state {record.state}")
    if entry is not None and entry.round_number != record.number:
        raise InvalidRecordError(f"privacy entry is for round {entry.round_number}, not round {record.number}")


def check_charge(entry: PrivacyEntry | None, number: int, charged: Iterable[int]) -> PrivacyEntry | None:
    """What `Store.mark_interrupted_rounds_aborted` (and `abort_round`)
    require of the entry a charge rule returned for round `number`: for that round
    (InvalidRecordError), which has none yet (`charged`: the rounds with an
    entry; ConflictError)."""
    if entry is None:
        return None
    if entry.round_number != number:
        raise InvalidRecordError(f"privacy entry is for round {entry.round_number}, not round {number}")
    if number in charged:
        raise ConflictError(f"round {number} already has a privacy entry")
    return entry


def check_enrollment_batch(devices: Sequence[tuple[bytes, str]]) -> list[bytes]:
    """The identity keys of an `enroll_devices` batch, in order; raises
    InvalidRecordError for an empty key, a key listed twice or a non-empty
    local_id (user handle) listed twice."""
    keys = [bytes(key) for key, _local_id in devices]
    seen: set[bytes] = set()
    handles: set[str] = set()
    for i, (key, (_, local_id)) in enumerate(zip(keys, devices, strict=True)):
        if not key:
            raise InvalidRecordError(f"device {i} of the batch has an empty identity key")
        if key in seen:
            raise InvalidRecordError(f"device {i} of the batch repeats an identity key")
        if local_id and local_id in handles:
            raise InvalidRecordError(f"device {i} of the batch repeats the local_id {local_id[:64]!r}")
        seen.add(key)
        handles.add(local_id)
    return keys


def check_audit_details(details: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of an audit entry's details, refused (InvalidRecordError)
    unless it is a JSON object."""
    if details is None:
        return {}
    if not isinstance(details, Mapping) or not all(isinstance(k, str) for k in details):
        raise InvalidRecordError("audit details must be a mapping with string keys")
    try:
        return dict(json.loads(json.dumps(dict(details), allow_nan=False)))
    except (TypeError, ValueError) as exc:
        raise InvalidRecordError(f"audit details must be JSON values: {exc}") from None


def enrollment_refusal(status: DeviceStatus, stored_client: str | None, client_id: str | None) -> str | None:
    """Why an already-enrolled device may not be enrolled again by
    `client_id` (an EnrollmentConflictError reason), or None when it may:
    both client ids are known and differ, or it is revoked. Ownership is
    checked first, so another client never learns that a device is revoked."""
    if stored_client and client_id and stored_client != client_id:
        return EnrollmentConflictError.OTHER_CLIENT
    if DeviceStatus(status) is not DeviceStatus.ACTIVE:
        return EnrollmentConflictError.REVOKED
    return None


def validate_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidRecordError(f"limit must be in 1..{MAX_PAGE}, got {limit}")


def summarize_privacy(ledger: Sequence[PrivacyEntry]) -> PrivacySummary:
    """Summary of a ledger sorted by ascending round number."""
    if not ledger:
        return PrivacySummary(
            rounds_accounted=0, last_round=None, cumulative_epsilon=0.0, delta=None, epsilon_sum=0.0
        )
    last = ledger[-1]
    return PrivacySummary(
        rounds_accounted=len(ledger),
        last_round=last.round_number,
        cumulative_epsilon=last.cumulative_epsilon,
        delta=last.delta,
        epsilon_sum=sum(e.epsilon for e in ledger),
    )


def page_of(items: tuple[T, ...], limit: int, key: Callable[[T], int]) -> Page[T]:
    """A Page from up to limit + 1 newest-first items (the extra one only
    signals that an older page exists)."""
    if len(items) > limit:
        return Page(items[:limit], key(items[limit - 1]))
    return Page(items, None)
