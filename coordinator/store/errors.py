"""Errors raised by every Store implementation (same types for all backends).

Callers catch `StoreError` for "the store refused or failed"; the subclasses
say why. Backend exceptions (sqlalchemy, psycopg, sqlite3) never escape a
Store method except as the `__cause__` of one of these.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every store failure."""


class InvalidRecordError(StoreError, ValueError):
    """The caller passed a record that violates the store's contract
    (wrong state for the operation, mismatched round numbers, bad values)."""


class NotFoundError(StoreError, LookupError):
    """The requested row does not exist."""


class ConflictError(StoreError):
    """The write conflicts with what is stored (e.g. the round is already
    terminal, or a duplicate unique key)."""


class CorruptBlobError(StoreError):
    """A model version's parameter blob does not match its stored sha256."""

    def __init__(self, version_id: int, expected: str, actual: str) -> None:
        super().__init__(
            f"model version {version_id}: parameter blob sha256 {actual} != recorded {expected}"
        )
        self.version_id = version_id
        self.expected = expected
        self.actual = actual


class EnrollmentConflictError(ConflictError):
    """`Store.enroll_devices` refused the whole batch (nothing was written)
    because one of its identity keys is already enrolled and may not be
    enrolled by this caller: the device is revoked (`reason` REVOKED) or it
    belongs to another client id (`reason` OTHER_CLIENT); or a new device's
    local_id (its user handle) is held by another device (`reason`
    HANDLE_TAKEN). `index` is the position of that device in the batch,
    `device_id` the stored id of the device in the way."""

    REVOKED = "revoked"
    OTHER_CLIENT = "other_client"
    HANDLE_TAKEN = "handle_taken"

    def __init__(self, index: int, device_id: int, reason: str) -> None:
        what = {self.REVOKED: "is revoked", self.HANDLE_TAKEN: "has a local_id another device holds"}.get(
            reason, "is enrolled by another client")
        super().__init__(f"device {index} of the batch (id {device_id}) {what}")
        self.index = index
        self.device_id = device_id
        self.reason = reason


__all__ = ["ConflictError", "CorruptBlobError", "EnrollmentConflictError", "InvalidRecordError", "NotFoundError",
           "StoreError"]
