"""Records of the share-report rule (coordinator/peer_reports.py, D37): the
share-check reports that count and the quarantines they started.

The store only persists them; which reports count and when a quarantine
starts, ends or is forgotten is decided by the pure rule. Kept in the store
so that every replica of the coordinator applies the same state.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from coordinator.store.errors import InvalidRecordError
from coordinator.store.records import as_utc

#: Longest credential (the enrolling client's identity, or "device:<id>").
MAX_CREDENTIAL = 255
_MAX_ID = 2**63 - 1


def _check_credential(value: object, what: str) -> None:
    if not isinstance(value, str) or not value or len(value) > MAX_CREDENTIAL:
        raise InvalidRecordError(f"{what} must be 1..{MAX_CREDENTIAL} characters, got {value!r:.80}")


def _check_id(value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_ID:
        raise InvalidRecordError(f"{what} must be an integer in 1..2^63-1, got {value!r:.40}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ShareReport:
    """One counted report: in round `round_number` (at `at`), a device of
    credential `reporter` could not open the shares of device `reported`."""

    round_number: int
    at: datetime
    reporter: str
    reported: int

    def __post_init__(self) -> None:
        _check_id(self.round_number, "round_number")
        _check_id(self.reported, "reported")
        _check_credential(self.reporter, "reporter")
        object.__setattr__(self, "at", as_utc(self.at, "at"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Quarantine:
    """Device `device_id` is left out of selection from `started_round` /
    `started_at` until round `until_round` or time `until`, whichever comes
    first, unless released earlier (`released_at`). `charged` are the
    reporter credentials whose quota it used. `id` is assigned by the store
    (0 before)."""

    device_id: int
    started_round: int
    started_at: datetime
    until_round: int
    until: datetime
    charged: tuple[str, ...] = ()
    released_at: datetime | None = None
    id: int = 0

    def __post_init__(self) -> None:
        _check_id(self.device_id, "device_id")
        _check_id(self.started_round, "started_round")
        if not isinstance(self.until_round, int) or self.until_round <= self.started_round:
            raise InvalidRecordError("until_round must be after started_round")
        for name in ("started_at", "until", "released_at"):
            object.__setattr__(self, name, as_utc(getattr(self, name), name))
        if self.until < self.started_at:
            raise InvalidRecordError("until must not be before started_at")
        object.__setattr__(self, "charged", tuple(self.charged))
        for c in self.charged:
            _check_credential(c, "charged credential")


__all__ = ["MAX_CREDENTIAL", "Quarantine", "ShareReport"]
