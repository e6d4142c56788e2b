"""The replica tier in the in-memory store: membership rows, stream
ownership, the fleet counter and the tier's secret (drawn when the store
is created). A mixin of `InMemoryStore`; the contracts
are those of coordinator/store/replica_interface.py. As for the leader
lease (memory_lease.py), the "database clock" is a parameter (the
process's monotonic clock by default, so tests can move it). Every method
holds the mixin's own lock; a write builds new dicts and publishes them
with one assignment each at the end, after every check, so a refused call
leaves nothing behind."""

from __future__ import annotations

import secrets
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from coordinator.store.errors import NotFoundError
from coordinator.store.lease_records import FencedOut, Lease
from coordinator.store.replica_records import (
    ReplicaRecord,
    StreamClaim,
    StreamOwner,
    StreamRow,
    StreamSync,
    check_join_request,
    check_publish,
    next_member_row,
    plan_publish,
)


@dataclass(frozen=True, slots=True)
class _Stream:
    """A device's stream row: the claim's row and its bookkeeping."""

    row: StreamRow
    claim: int
    updated_at: float


class InMemoryReplicas:
    """Replica membership and stream ownership in process memory."""

    if TYPE_CHECKING:  # provided by InMemoryStore
        def _enrolled_devices(self, device_ids: Iterable[int]) -> set[int]: ...

    def __init__(self, replica_clock: Callable[[], float] = time.monotonic) -> None:
        self._replicas_lock = threading.RLock()
        self._replica_clock = replica_clock
        self._members: dict[str, ReplicaRecord] = {}
        self._streams: dict[int, _Stream] = {}
        self._fleet_version = 0
        self._tier_secret = secrets.token_bytes(32)

    def join_tier(self, replica: str, seconds: float, *, settings_digest: str, device_address: str | None = None,
                  admin_address: str | None = None, renewing: Lease | None = None) -> Lease | None:
        check_join_request(replica, seconds, settings_digest, device_address, admin_address, renewing)
        with self._replicas_lock:
            now = self._replica_clock()
            row = self._members.get(replica) or ReplicaRecord(replica, 0, -float("inf"), 0.0, "", None, None, 0)
            after = next_member_row(row.token, row.expires_at, renewing, seconds, now)
            if after is None:
                return None
            if after.token != row.token:  # a new term
                row = replace(row, token=after.token, joined_at=now)
                self._fleet_version += 1
            self._members = {**self._members, replica: replace(
                row, expires_at=after.expires_at, settings_digest=settings_digest, device_address=device_address,
                admin_address=admin_address)}
            return Lease(replica, after.token, seconds)

    def leave_tier(self, lease: Lease) -> None:
        with self._replicas_lock:
            row = self._members.get(lease.holder)
            if row is None or row.token != lease.token:
                return
            ran = row.expires_at > self._replica_clock()
            kept = {d: s for d, s in self._streams.items()
                    if (s.row.replica, s.row.token) != (lease.holder, lease.token)}
            if ran or len(kept) != len(self._streams):
                self._fleet_version += 1
            self._members = {**self._members, lease.holder: replace(row, expires_at=-float("inf"))}
            self._streams = kept

    def live_replicas(self) -> list[ReplicaRecord]:
        with self._replicas_lock:
            now = self._replica_clock()
            return [r for _, r in sorted(self._members.items()) if r.expires_at > now]

    def publish_streams(self, member: Lease, *, claims: Sequence[StreamClaim] = (),
                        availability: Mapping[int, bool] | None = None, released: Iterable[int] = ()) -> StreamSync:
        request = check_publish(claims, availability or {}, released)
        with self._replicas_lock:
            now = self._replica_clock()
            row = self._members.get(member.holder)
            if row is None or row.token != member.token or row.expires_at <= now:
                current = "none" if row is None else f"{row.token}, expires {row.expires_at - now:+.3f} s from now"
                raise FencedOut(f"{member.holder} is not a member under token {member.token} (the row: {current})")
            claimed = {c.device_id for c in request.claims}
            if missing := sorted(claimed - self._enrolled_devices(claimed)):
                raise NotFoundError(f"devices {missing} are not enrolled")
            stored = {d: self._streams[d].row for d in request.devices if d in self._streams}
            plan = plan_publish(member, request, stored)
            if not plan.changes:
                return StreamSync(plan.displaced)
            version = self._fleet_version + 1
            streams = dict(self._streams)
            for c in plan.claims:
                streams[c.device_id] = _Stream(StreamRow(member.holder, member.token, c.session_key, c.available),
                                               version, now)
            for d, available in plan.availability.items():
                streams[d] = replace(streams[d], row=replace(streams[d].row, available=available), updated_at=now)
            for d in plan.released:
                del streams[d]
            self._streams, self._fleet_version = streams, version
            self._members = {**self._members, member.holder: replace(row, streams_version=version)}
            return StreamSync(plan.displaced)

    def _running(self, stream: _Stream, now: float) -> bool:
        """Whether `stream`'s term is its replica's running term."""
        row = self._members.get(stream.row.replica)
        return row is not None and row.token == stream.row.token and row.expires_at > now

    def stream_owner(self, device_id: int) -> StreamOwner | None:
        with self._replicas_lock:
            stream = self._streams.get(device_id)
            if stream is None or not self._running(stream, self._replica_clock()):
                return None
            return StreamOwner(stream.row.replica, stream.row.session_key, stream.row.available)

    def available_by_replica(self) -> dict[str, list[tuple[int, int]]]:
        with self._replicas_lock:
            now = self._replica_clock()
            out: defaultdict[str, list[tuple[int, int]]] = defaultdict(list)
            for device_id, stream in sorted(self._streams.items()):
                if stream.row.available and self._running(stream, now):
                    out[stream.row.replica].append((device_id, stream.row.session_key))
            return dict(sorted(out.items()))

    def stream_counts(self) -> dict[str, tuple[int, int]]:
        with self._replicas_lock:
            now = self._replica_clock()
            out = {name: [0, 0] for name, r in self._members.items() if r.expires_at > now}
            for stream in self._streams.values():
                if self._running(stream, now):
                    counts = out[stream.row.replica]
                    counts[0] += 1
                    counts[1] += stream.row.available
            return {name: (c[0], c[1]) for name, c in sorted(out.items())}

    def fleet_version(self) -> int:
        with self._replicas_lock:
            return self._fleet_version

    def tier_secret(self) -> bytes:
        with self._replicas_lock:
            return self._tier_secret
