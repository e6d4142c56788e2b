"""The leader lease of a replicated coordinator (D90): which replica leads
the federation, until when, and the fencing token of its term.

One lease exists per store. A replica takes it when it is free or expired,
and renews it while it holds it; the store computes every expiry with the
DATABASE's clock, never a replica's, so replicas whose clocks disagree
still agree on who leads. Each takeover increments `token`; a renewal by
the holder keeps it. Writes that only the leader may make (committing or
aborting a round) carry the holder's lease as a fence, and the store
refuses them, in the same transaction, unless the lease row still names
that holder and that token (`FencedOut`). So a leader deposed while it was
paused can never commit, whatever its own clock says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from coordinator.store.errors import InvalidRecordError, StoreError

__all__ = ["MAX_HOLDER_CHARS", "FencedOut", "Lease", "LeaseRow", "check_lease_request", "next_lease_row"]

MAX_HOLDER_CHARS = 255
#: Longest lease a replica may ask for: a dead leader stops the federation
#: for up to this long, so anything longer is a configuration error.
MAX_LEASE_S = 3600.0


class FencedOut(StoreError):
    """A fenced write by a replica that no longer holds the lease (another
    replica took it over: the token moved on). Nothing was written."""


@dataclass(frozen=True, slots=True)
class Lease:
    """A replica's hold on the leadership, as the store granted it.

    `remaining_s` is how long the lease still ran when the store granted it,
    by the database's clock; the holder must treat itself as deposed once
    that much time has passed on its own monotonic clock (minus a margin),
    unless it renewed the lease before.
    """

    holder: str
    token: int
    remaining_s: float

    def __post_init__(self) -> None:
        _check_holder(self.holder)
        if not (isinstance(self.token, int) and self.token >= 1):
            raise InvalidRecordError(f"a lease token is a positive integer, got {self.token!r}")
        if not (math.isfinite(self.remaining_s) and 0 < self.remaining_s <= MAX_LEASE_S):
            raise InvalidRecordError(f"a lease's remaining time is in (0, {MAX_LEASE_S:g}] s, not {self.remaining_s!r}")


def _check_holder(holder: str) -> None:
    if not (isinstance(holder, str) and 0 < len(holder) <= MAX_HOLDER_CHARS):
        raise InvalidRecordError(f"a lease holder is a name of 1 to {MAX_HOLDER_CHARS} characters")


def check_lease_request(holder: str, seconds: float) -> None:
    """Refuse a holder name or a lease duration no lease can have."""
    _check_holder(holder)
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_LEASE_S):
        raise InvalidRecordError(f"a lease lasts more than 0 and at most {MAX_LEASE_S:g} s, not {seconds!r}")


@dataclass(frozen=True, slots=True)
class LeaseRow:
    """The stored lease: its holder (None: released), term token, and expiry
    in seconds by the store's clock."""

    holder: str | None
    token: int
    expires_at: float


def next_lease_row(row: LeaseRow, holder: str, seconds: float, now: float) -> LeaseRow | None:
    """The rule of `acquire_lease`, apart from the storage: the row after
    `holder` asks for `seconds` at store time `now`, or None when another
    holder's lease still runs. A free or expired lease starts a new term
    (token + 1); the running holder's renewal keeps its term."""
    held = row.holder is not None and row.expires_at > now
    if held and row.holder != holder:
        return None
    return LeaseRow(holder, row.token if held else row.token + 1, now + seconds)
