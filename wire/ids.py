"""Round-local id mapping: enrolled device ids <-> secagg ids.

Three id spaces meet on the wire:

* ``device_id`` (proto, uint64 >= 1): the id the coordinator assigned at
  enrolment. Every proto message names devices by it.
* ``Participant.secagg_id`` (proto, uint32, **1-based**): the device's
  round-local position in the cohort, 1..n, unique within one round. It is
  exactly the Shamir evaluation point x of the device's shares.
* the secagg id (``secagg`` package, **0-based**): 0..n-1, with
  ``secagg_id_in_proto = secagg_id + 1`` (secagg's ``shamir.x_of(i) == i + 1``).
  secagg messages, graphs and signature transcripts use this one.

So ``RoundIds.secagg(device_id) == Participant.secagg_id - 1``. The pairwise
mask sign (+ if u < v) and the SecAgg+ graph both use the 0-based order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from wire.errors import WireError

if TYPE_CHECKING:
    from fedmask_proto.v1.session_pb2 import Participant

MAX_DEVICE_ID = (1 << 64) - 1


class RoundIds:
    """A bijection between (some of) a round's device ids and secagg ids.

    The coordinator holds the full map of the cohort; an edge client holds
    only its devices and their neighbours (what its RoundTask lists). Lookups
    of an id not in the map raise WireError."""

    __slots__ = ("_to_secagg", "_to_device", "num_clients", "components")

    def __init__(self, device_to_secagg: Mapping[int, int], *, num_clients: int, components: int = 0) -> None:
        if not (isinstance(num_clients, int) and num_clients >= 1):
            raise WireError(f"num_clients must be a positive int, got {num_clients!r}")
        to_secagg: dict[int, int] = {}
        to_device: dict[int, int] = {}
        for device_id, secagg_id in device_to_secagg.items():
            if not (isinstance(device_id, int) and 1 <= device_id <= MAX_DEVICE_ID):
                raise WireError(f"device id {device_id!r} is not a uint64 >= 1")
            if not (isinstance(secagg_id, int) and 0 <= secagg_id < num_clients):
                raise WireError(f"secagg id {secagg_id!r} of device {device_id} is outside 0..{num_clients - 1}")
            if secagg_id in to_device and to_device[secagg_id] != device_id:
                raise WireError(f"secagg id {secagg_id} is given to devices {to_device[secagg_id]} and {device_id}")
            to_secagg[device_id] = secagg_id
            to_device[secagg_id] = device_id
        self._to_secagg = to_secagg
        self._to_device = to_device
        self.num_clients = num_clients
        #: removable noise's seeded components per device (SecAggConfig.removable_components): the
        #: sealed share blobs and unmasking responses of the round carry one share per component
        self.components = components

    @classmethod
    def from_cohort(cls, device_ids: Iterable[int], *, components: int = 0) -> RoundIds:
        """Coordinator side: the i-th device of the cohort gets secagg id i
        (proto secagg_id i + 1)."""
        ids = list(device_ids)
        if len(set(ids)) != len(ids):
            raise WireError("the cohort lists a device twice")
        return cls({d: i for i, d in enumerate(ids)}, num_clients=len(ids), components=components)

    @classmethod
    def from_participants(cls, participants: Iterable[Participant], *, num_clients: int,
                          components: int = 0) -> RoundIds:
        """From proto Participants (1-based secagg_id); a device listed twice
        must carry the same secagg_id both times."""
        pairs: dict[int, int] = {}
        for p in participants:
            if not (1 <= p.secagg_id <= num_clients):
                raise WireError(f"Participant {p.device_id} has secagg_id {p.secagg_id}, outside 1..{num_clients}")
            sid = p.secagg_id - 1
            if pairs.get(p.device_id, sid) != sid:
                raise WireError(f"device {p.device_id} is given two secagg ids")
            pairs[p.device_id] = sid
        return cls(pairs, num_clients=num_clients, components=components)

    def secagg(self, device_id: int) -> int:
        """0-based secagg id of an enrolled device id."""
        try:
            return self._to_secagg[device_id]
        except (KeyError, TypeError):
            raise WireError(f"device {device_id!r} is not part of this round") from None

    def device(self, secagg_id: int) -> int:
        """Enrolled device id of a 0-based secagg id."""
        try:
            return self._to_device[secagg_id]
        except (KeyError, TypeError):
            raise WireError(f"secagg id {secagg_id!r} is not part of this round") from None

    def proto_secagg_id(self, device_id: int) -> int:
        """The 1-based Participant.secagg_id of a device."""
        return self.secagg(device_id) + 1

    def has_device(self, device_id: int) -> bool:
        return device_id in self._to_secagg

    def device_ids(self) -> list[int]:
        """Known device ids, by ascending secagg id."""
        return [self._to_device[s] for s in sorted(self._to_device)]

    def __len__(self) -> int:
        return len(self._to_secagg)

    def __repr__(self) -> str:
        return f"RoundIds({len(self)} of n={self.num_clients})"
