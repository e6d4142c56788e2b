"""The replica tier's part of the Store interface: membership of the
coordinator replicas and the ownership of device streams (records and the
rule: coordinator/store/replica_records.py) and the tier's shared
secret. `Store` extends it; the
general contract of coordinator/store/interface.py holds (every method one
transaction, thread- and process-safe, store errors only).

Clock: every expiry is computed by the store's clock (the database's on
SQL), as for the leader lease (D90), so replicas whose clocks disagree
agree on who is a member. A membership's `Lease` carries the replica's
name as `holder` and its term's token.

Locking on PostgreSQL (all writers take the locks in this order, so they
never deadlock each other): the replica's membership row FOR UPDATE, then
the one-row fleet counter FOR UPDATE (a join only when it starts a term,
a leave whenever it names the current term), then device stream rows. Every publish takes the
counter, so publishes of the whole tier are serialised: "last claim wins"
is commit order, and each publish reads the stream rows as the previous
one left them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from coordinator.store.lease_records import Lease
from coordinator.store.replica_records import ReplicaRecord, StreamClaim, StreamOwner, StreamSync


@runtime_checkable
class ReplicaStore(Protocol):
    def join_tier(self, replica: str, seconds: float, *, settings_digest: str, device_address: str | None = None,
                  admin_address: str | None = None, renewing: Lease | None = None) -> Lease | None:
        """Join the tier as `replica` for `seconds` by the store's clock, or
        renew the term `renewing` (the Lease an earlier join returned).
        When the replica's row has no running term (never joined, expired,
        or left) a new term starts, its token one more than the row's last
        (from 1), whether `renewing` is given or not. When a term runs,
        only a join renewing that very term succeeds: it keeps the token
        and moves the expiry; any other join of that name (no `renewing`,
        or an older term's) returns None and changes nothing. Either way
        the row then holds the given digest and addresses; `joined_at` is
        the start of the term. A new term makes `fleet_version` grow.
        Raises InvalidRecordError for a name or duration no lease can have
        (lease_records.check_lease_request), a digest over 64 characters,
        an empty or over-long address, or `renewing` of another name."""
        ...

    def leave_tier(self, lease: Lease) -> None:
        """End the membership term `lease` now if it is the replica's
        current term (a clean shutdown; the next join starts a new term),
        and delete the stream rows of that term; otherwise nothing. Makes
        `fleet_version` grow when it ended a running term or deleted a row."""
        ...

    def live_replicas(self) -> list[ReplicaRecord]:
        """The members whose term runs by the store's clock, by name."""
        ...

    def publish_streams(self, member: Lease, *, claims: Sequence[StreamClaim] = (),
                        availability: Mapping[int, bool] | None = None, released: Iterable[int] = ()) -> StreamSync:
        """A replica's streams, in ONE transaction fenced by its membership:
        raises FencedOut, nothing written, unless `member` is the running
        term of its replica (same token, not expired by the store's clock).

          * `claims`: each takes its device's row, whoever held it (the last
            claim wins): the row names this replica and term, the claim's
            session key and availability.
          * `availability`: every OTHER device the replica believes it
            holds, with its availability now (a snapshot, not a delta). It
            is written only where the device's row still names this term.
          * `released`: streams the replica closed; a row naming this
            replica (of any of its terms) is deleted, another's is kept.

        Returns `displaced`: the devices of `availability` whose row does
        not name this term (claimed by another replica or by an earlier
        term of this one, or deleted); the replica should drop those
        streams, or claim them again. A device of `claims` is never
        displaced by the publish that claims it.
        When a row changed, `fleet_version` grows by one and the replica's
        `streams_version` becomes it; a publish that changes nothing
        leaves both. Raises InvalidRecordError (a bad id or value, a device
        named twice) and NotFoundError (a claim of a device that is not
        enrolled); nothing is written then."""
        ...

    def stream_owner(self, device_id: int) -> StreamOwner | None:
        """Who holds device `device_id`'s stream: its row's replica, when
        the row's term is that replica's running term; otherwise None."""
        ...

    def available_by_replica(self) -> dict[str, list[tuple[int, int]]]:
        """For each live replica holding at least one available device (by
        rows of its running term): its (device_id, session_key) pairs,
        ascending device id."""
        ...

    def stream_counts(self) -> dict[str, tuple[int, int]]:
        """For each live replica, (streams held, of them available) by its
        running term's stream rows; (0, 0) for a live replica holding none.
        Counted in the store, never by listing the rows."""
        ...

    def fleet_version(self) -> int:
        """A counter that grows whenever a publish changes a stream row, a
        term starts, or a leave ends a term or deletes rows (0 on a new
        store). An expiry writes nothing, so it does not move the counter:
        a poller also watches the terms' `expires_at`."""
        ...

    def tier_secret(self) -> bytes:
        """The tier's secret: 32 bytes, the same for every call and every
        store object on the same database (so every replica of the tier
        reads the same), drawn at random once per database (SQL: by
        migration 0009; memory: when the store is created, so two stores
        differ). Replicas MAC what any of them must verify with it
        (coordinator/possession.py: enrolment challenges). Never for the
        admin service: its read-only role cannot read it. Raises
        NotFoundError when a SQL database lacks the row (migrated by
        hand and the row deleted)."""
        ...
