"""How a round's messages reach its devices: over the session stream that
hosts each device (`DeviceRegistry.owner`), one copy per stream for a
broadcast, and the RoundTasks one per stream for the cohort devices it
hosts. It also relays the identity certificates of an active round (D33):
each device's certificate from its AdvertiseKeys is kept (checked against
`secagg.device_ca` when one is configured) and written unread into the
PeerKeys the round machine sends.

`RoundDelivery` is composed by the `Coordinator` (service.py) and runs on
its event loop; it never decides anything about the round itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

from cryptography import x509

from coordinator.registry import ClientSession, DeviceRegistry
from fedmask_proto.v1 import secagg_pb2, session_pb2
from secagg.device_certificates import MAX_CERTIFICATE_BYTES, certificate_refusal


class RoundDelivery:
    """See the module doc."""

    def __init__(self, registry: DeviceRegistry, *, device_ca: Path | None,
                 wall_clock: Callable[[], datetime]) -> None:
        self._registry = registry
        self._wall = wall_clock
        self._device_ca = x509.load_pem_x509_certificate(device_ca.read_bytes()) if device_ca is not None else None
        #: the running round's certificates (device id -> DER), relayed unread in PeerKeys (D33)
        self._certificates: dict[int, bytes] = {}

    def new_round(self) -> None:
        """Forget the previous round's certificates."""
        self._certificates = {}

    def certificate_refusal(self, device_id: int, advert: secagg_pb2.AdvertiseKeys, *, active: bool) -> str | None:
        """Why the identity certificate of `device_id`'s AdvertiseKeys is
        refused (with a device CA, in an active round, the device's first
        certificate only), or None: then a certificate it sent is kept for
        the PeerKeys."""
        if self._device_ca is not None and active and device_id not in self._certificates:
            why = certificate_refusal(bytes(advert.identity_certificate), self._device_ca,
                                      self._registry.devices[device_id].identity_public_key, device_id,
                                      now=self._wall())
            if why is not None:
                return why
        if advert.identity_certificate:
            self._certificates.setdefault(device_id, bytes(advert.identity_certificate[:MAX_CERTIFICATE_BYTES]))
        return None

    def send(self, device_id: int, message: session_pb2.ServerMessage) -> None:
        """To the stream hosting `device_id` (none: dropped); PeerKeys get
        the kept certificates."""
        owner = self._registry.owner(device_id)
        if owner is None:
            return
        if message.WhichOneof("message") == "advertised_keys":
            for peer in message.advertised_keys.peers:  # relayed as sent (D33)
                peer.identity_certificate = self._certificates.get(peer.device_id, b"")
        owner.send(message)

    def broadcast(self, device_ids: Sequence[int], message: session_pb2.ServerMessage) -> None:
        """Once to each stream hosting one of `device_ids`."""
        seen: set[int] = set()
        for d in device_ids:
            owner = self._registry.owner(d)
            if owner is not None and owner.sid not in seen:
                seen.add(owner.sid)
                owner.send(message)

    def send_tasks(self, cohort: Sequence[int], task: Callable[[list[int]], session_pb2.RoundTask], *,
                   gone: Callable[[int], None]) -> None:
        """One RoundTask per stream, `task(devices)` for the cohort devices it
        hosts; first `gone(device)` for each cohort device no stream hosts
        (it left after the selection)."""
        groups: dict[int, list[int]] = {}
        sessions: dict[int, ClientSession] = {}
        for d in cohort:
            s = self._registry.owner(d)
            if s is None:
                gone(d)
                continue
            groups.setdefault(s.sid, []).append(d)
            sessions[s.sid] = s
        for sid, devices in groups.items():
            sessions[sid].send(session_pb2.ServerMessage(round_task=task(devices)))


__all__ = ["RoundDelivery"]
