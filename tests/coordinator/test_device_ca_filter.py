"""An honest coordinator configured with the device CA (secagg.device_ca,
D33) drops a device whose identity certificate does not verify, as a
protocol violation of that device: the round goes on without it, and the
other devices never see its keys (so they have nothing to withdraw over);
the certificates of the others are relayed in PeerKeys."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from coordinator.store import RoundState
from coordinator_fakes import FakeClient, FakeDevice, enroll
from fedmask.certs import InitReport, PkiLayout, generate_key, init_device_ca, load_certificate, load_private_key, make_ca
from secagg.device_certificates import certificate_refusal, issue_device_certificate
from test_grpc_end_to_end import _wait_rounds, make_settings, running


def test_a_device_without_a_valid_identity_certificate_is_dropped_alone(tmp_path: Path) -> None:
    layout = PkiLayout(tmp_path / "device-ca")
    init_device_ca(layout, InitReport(layout))
    ca, ca_key = load_certificate(layout.device_ca_cert), load_private_key(layout.device_ca_key)
    rogue_key = generate_key()
    rogue_ca = make_ca(rogue_key)  # e.g. the coordinator's own CA: not the device CA
    now = datetime.now(UTC)
    der = serialization.Encoding.DER

    async def main() -> None:
        settings = make_settings(**{"secagg.signatures": True, "secagg.consistency_check": True,
                                    "secagg.device_ca": str(layout.device_ca_cert), "cohort.size": 5,
                                    "cohort.minimum": 5, "secagg.threshold": "majority"})
        async with running(settings) as (coord, target, store, rounds):
            enrolled = await enroll(target, 5)
            devices = []
            for i, (d, k) in enumerate(enrolled):
                issuer, issuer_key = (rogue_ca, rogue_key) if i == 0 else (ca, ca_key)
                cert = issue_device_certificate(issuer, issuer_key, k.public_key(), d, now=now).public_bytes(der)
                devices.append(FakeDevice(d, seed=7, identity_key=k, certificate=cert))
            client = FakeClient(target, devices)
            await client.start()
            await _wait_rounds(rounds)
            rec = store.get_round(1)
            assert rec.state is RoundState.COMMITTED
            bad = devices[0].device_id
            assert rec.dropouts == {"advertise_keys": [bad]}
            for dev in devices[1:]:
                (keys,) = dev.advertised
                peers = {p.device_id: p for p in keys.peers}
                assert bad not in peers
                for p in peers.values():  # relayed as sent, and each verifies against the device CA
                    assert certificate_refusal(p.identity_certificate, ca, p.identity_public_key, p.device_id,
                                               now=now) is None
            await client.close()

    asyncio.run(main())
