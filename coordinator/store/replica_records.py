"""Records of the replica tier: which coordinator replicas are members, and
which replica holds each device's stream.

Membership is a lease per replica name (the rule of the leader lease, D90,
applied to one row per replica): a replica joins for some seconds by the
DATABASE's clock and renews its term before it runs out; every new term
(a first join, or a join after the previous term expired or was left)
gets a larger token, a renewal keeps it. Ownership of a device's stream is
one row per device naming the replica and the term that claimed it; only
rows of a live term count (an expired or superseded term's rows are
ignored by every reader). The store only persists; which replica should
hold which stream is decided elsewhere.

The rule of `publish_streams`, apart from the storage, is `plan_publish`
here, so the SQL and the in-memory store apply the same one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from coordinator.store.errors import InvalidRecordError
from coordinator.store.lease_records import Lease, LeaseRow, check_lease_request, next_lease_row

__all__ = ["ReplicaRecord", "StreamClaim", "StreamOwner", "StreamSync"]

#: Longest replica address (host:port or URL) and settings digest (sha256 hex).
MAX_ADDRESS_CHARS = 255
MAX_DIGEST_CHARS = 64
_MIN_BIGINT, _MAX_BIGINT = -(2**63), 2**63 - 1


@dataclass(frozen=True, slots=True)
class ReplicaRecord:
    """A live member of the tier. `expires_at` and `joined_at` (the start
    of its current term) are seconds by the store's clock (the database's
    epoch seconds on SQL, the process's monotonic clock in memory): compare
    them with each other, never with a replica's own clock.
    `streams_version` is the `fleet_version` of the last publish of this
    replica that changed a stream row (0: none yet)."""

    name: str
    token: int
    expires_at: float
    joined_at: float
    settings_digest: str
    device_address: str | None
    admin_address: str | None
    streams_version: int


def _check_bigint(value: object, what: str, *, low: int = _MIN_BIGINT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= _MAX_BIGINT:
        raise InvalidRecordError(f"{what} must be an integer in {low}..2^63-1, got {value!r:.40}")
    return value


@dataclass(frozen=True, slots=True)
class StreamClaim:
    """A replica takes device `device_id`'s stream, opened under
    `session_key` (the replica's handle of that session, any 64-bit
    integer), and says whether the device is available for a round."""

    device_id: int
    session_key: int
    available: bool

    def __post_init__(self) -> None:
        _check_bigint(self.device_id, "device_id", low=1)
        _check_bigint(self.session_key, "session_key")
        if not isinstance(self.available, bool):
            raise InvalidRecordError(f"available must be a bool, got {self.available!r:.40}")


@dataclass(frozen=True, slots=True)
class StreamOwner:
    """The live replica holding a device's stream, its session key and
    whether the device is available."""

    replica: str
    session_key: int
    available: bool


@dataclass(frozen=True, slots=True)
class StreamSync:
    """What a publish tells its replica: `displaced` are the devices of its
    `availability` whose stream rows no longer name its term (another
    replica claimed them, or the row is gone): it should drop those
    streams, or claim them again."""

    displaced: frozenset[int]


def check_join_request(replica: str, seconds: float, settings_digest: str,
                       device_address: str | None, admin_address: str | None, renewing: Lease | None) -> None:
    """Refuse a join no membership row can hold (InvalidRecordError)."""
    check_lease_request(replica, seconds)
    if not isinstance(settings_digest, str) or len(settings_digest) > MAX_DIGEST_CHARS:
        raise InvalidRecordError(f"settings_digest is a string of at most {MAX_DIGEST_CHARS} characters")
    for what, address in (("device_address", device_address), ("admin_address", admin_address)):
        if address is not None and not (isinstance(address, str) and 0 < len(address) <= MAX_ADDRESS_CHARS):
            raise InvalidRecordError(f"{what} is None or 1 to {MAX_ADDRESS_CHARS} characters")
    if renewing is not None and renewing.holder != replica:
        raise InvalidRecordError(f"{replica} cannot renew the membership of {renewing.holder}")


def next_member_row(token: int, expires_at: float, renewing: Lease | None, seconds: float,
                    now: float) -> LeaseRow | None:
    """The rule of `join_tier` for one replica's row (`next_lease_row`,
    whose "holder" is the term): the row after a join at store time `now`,
    or None. A row whose term runs is renewed (same token) only by a join
    `renewing` that very term; any other join of that name is refused while
    it runs. A free, expired or left row starts a new term (token + 1)."""
    asker = f"term {renewing.token}" if renewing is not None else "a new term"
    return next_lease_row(LeaseRow(f"term {token}", token, expires_at), asker, seconds, now)


@dataclass(frozen=True, slots=True)
class PublishRequest:
    """A checked `publish_streams` request: claims by ascending device id,
    availability and releases as given (no device in two of them)."""

    claims: tuple[StreamClaim, ...]
    availability: dict[int, bool]
    released: tuple[int, ...]

    @property
    def devices(self) -> list[int]:
        """Every device the request names, ascending."""
        return sorted({c.device_id for c in self.claims} | set(self.availability) | set(self.released))


def check_publish(claims: Sequence[StreamClaim], availability: Mapping[int, bool],
                  released: Iterable[int]) -> PublishRequest:
    """The request, checked: InvalidRecordError for a claim that is not a
    StreamClaim, a bad device id or availability, or a device named twice
    (twice among the claims, or in two of claims, availability, released)."""
    named: set[int] = set()

    def name(device_id: int) -> None:
        _check_bigint(device_id, "device_id", low=1)
        if device_id in named:
            raise InvalidRecordError(f"device {device_id} is named twice in one publish")
        named.add(device_id)

    for c in claims:
        if not isinstance(c, StreamClaim):
            raise InvalidRecordError(f"a claim is a StreamClaim, not {type(c).__name__}")
        name(c.device_id)
    for device_id, available in availability.items():
        name(device_id)
        if not isinstance(available, bool):
            raise InvalidRecordError(f"the availability of device {device_id} must be a bool")
    gone = tuple(released)
    for device_id in gone:
        name(device_id)
    return PublishRequest(tuple(sorted(claims, key=lambda c: c.device_id)), dict(availability), gone)


@dataclass(frozen=True, slots=True)
class StreamRow:
    """A device's stored stream row: the replica and term that claimed it."""

    replica: str
    token: int
    session_key: int
    available: bool


@dataclass(frozen=True, slots=True)
class PublishPlan:
    """The writes of one publish (only those that change a row) and its answer."""

    claims: tuple[StreamClaim, ...]
    availability: dict[int, bool]
    released: tuple[int, ...]
    displaced: frozenset[int]

    @property
    def changes(self) -> bool:
        return bool(self.claims or self.availability or self.released)


def plan_publish(member: Lease, request: PublishRequest, stored: Mapping[int, StreamRow]) -> PublishPlan:
    """The rule of `publish_streams` given the stored rows of the request's
    devices (`stored`; absent: no row): a claim takes the row unless it
    already holds exactly the claim; an availability update applies to a
    row of the member's term whose availability differs, and a device of
    `availability` whose row is not the term's is displaced; a release
    deletes a row that names the member's replica (any of its terms)."""
    mine = {d for d, row in stored.items() if row.replica == member.holder and row.token == member.token}
    claims = tuple(c for c in request.claims
                   if stored.get(c.device_id) != StreamRow(member.holder, member.token, c.session_key, c.available))
    availability = {d: v for d, v in request.availability.items() if d in mine and stored[d].available != v}
    displaced = frozenset(d for d in request.availability if d not in mine)
    released = tuple(d for d in request.released if d in stored and stored[d].replica == member.holder)
    return PublishPlan(claims, availability, released, displaced)
