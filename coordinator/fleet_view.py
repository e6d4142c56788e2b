"""The leader's view of the devices the whole tier holds (D109): which
replica holds each available device's stream, and which of them a round
may select.

`FleetView.read()` (blocking: run it in a worker thread) reads the store
once: `live_replicas()` and `available_by_replica()`. Only members whose
`settings_digest` is the leader's count (`digest`; None: every member): a
replica configured otherwise could not reproduce the tasks the leader
binds (`assignment.binding_matches`), so its devices are not offered.
The result (`Fleet`) is a snapshot:

- `members`: each counted replica's membership term as a `Lease` (its
  holder and token are what the leader writes into the group rows it
  assigns to that replica; its `remaining_s` means nothing here);
- `available`: replica -> its available devices, ascending;
- `hosts`: device -> (replica, session key), the device's stream as
  `round_groups.replica_groups` groups by it (a stream's devices in one
  group; the replica in the key, so no two replicas' streams are confused).

`Fleet.eligible_by_replica(...)` applies the exclusions the in-process
round loop's `eligible()` applies (round_loop.py), over the whole tier:
devices of a round still running (`busy`), devices that spent their
contribution on this model version (`SpentDevices.devices`, D85), the
previous round's contributors unless cohort.allow_consecutive, and the
devices quarantine keeps out (`ReportLedger.excluded`, D37, which never
leaves fewer than the minimum), quarantine decided over the tier's
eligible devices together as one coordinator decides over its own.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from coordinator.selection import eligible_devices
from coordinator.store import Lease, Store


@dataclass(frozen=True)
class Fleet:
    """One read of the tier (the module doc)."""

    members: dict[str, Lease] = field(default_factory=dict)
    available: dict[str, tuple[int, ...]] = field(default_factory=dict)
    hosts: dict[int, tuple[str, int]] = field(default_factory=dict)

    def replica_of(self, device_id: int) -> str | None:
        host = self.hosts.get(device_id)
        return host[0] if host is not None else None

    def eligible_by_replica(self, *, busy: Collection[int] = (), spent: Collection[int] = (),
                            previous_contributors: Collection[int] = (), allow_consecutive: bool = False,
                            excluded: Callable[[Iterable[int], int], frozenset[int]] | None = None,
                            minimum: int = 2) -> dict[str, list[int]]:
        """Replica -> its selectable devices, ascending (the module doc);
        `excluded(free, minimum)`: the quarantine rule (`ReportLedger.excluded`),
        asked once over every replica's free devices. Replicas left with
        none are omitted."""
        free = {name: eligible_devices(devices, busy=set(busy) | set(spent),
                                       previous_contributors=previous_contributors,
                                       allow_consecutive=allow_consecutive)
                for name, devices in self.available.items()}
        out_of = excluded([d for devices in free.values() for d in devices], minimum) if excluded else frozenset()
        kept = {name: [d for d in devices if d not in out_of] for name, devices in free.items()}
        return {name: devices for name, devices in sorted(kept.items()) if devices}


class FleetView:
    """Reads the tier's `Fleet` from the store (the module doc)."""

    def __init__(self, store: Store, *, digest: str | None) -> None:
        self.store = store
        self.digest = digest

    def read(self) -> Fleet:
        """Blocking: one read of the members and their available devices."""
        members = {r.name: Lease(holder=r.name, token=r.token, remaining_s=1.0)  # only holder and token are read
                   for r in self.store.live_replicas() if self.digest is None or r.settings_digest == self.digest}
        available: dict[str, tuple[int, ...]] = {}
        hosts: dict[int, tuple[str, int]] = {}
        for name, pairs in self.store.available_by_replica().items():
            if name not in members:
                continue
            available[name] = tuple(sorted(d for d, _ in pairs))
            hosts.update((d, (name, key)) for d, key in pairs)
        return Fleet(members, available, hosts)


__all__ = ["Fleet", "FleetView"]
