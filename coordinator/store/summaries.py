"""Pure helpers shared by the Store implementations."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from coordinator.store.errors import EnrollmentConflictError, InvalidRecordError
from coordinator.store.records import DeviceStatus, Page, PrivacyEntry, PrivacySummary, RoundRecord, RoundState

T = TypeVar("T")

MAX_PAGE = 1000


def check_commit_args(record: RoundRecord, entry: PrivacyEntry | None) -> None:
    """What `Store.commit_round` requires of its arguments (InvalidRecordError)."""
    if record.state is not RoundState.COMMITTED:
        raise InvalidRecordError(f"commit_round got state {record.state}")
    if entry is not None and entry.round_number != record.number:
        raise InvalidRecordError(f"privacy entry is for round {entry.round_number}, not round {record.number}")


def check_enrollment_batch(devices: Sequence[tuple[bytes, str]]) -> list[bytes]:
    """The identity keys of an `enroll_devices` batch, in order; raises
    InvalidRecordError for an empty key or a key listed twice."""
    keys = [bytes(key) for key, _local_id in devices]
    seen: set[bytes] = set()
    for i, key in enumerate(keys):
        if not key:
            raise InvalidRecordError(f"device {i} of the batch has an empty identity key")
        if key in seen:
            raise InvalidRecordError(f"device {i} of the batch repeats an identity key")
        seen.add(key)
    return keys


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
