"""Identity keys bound to a device CA the coordinator does not hold (D33).

A real edge client configured with `device_ca` against the fake coordinator
(which runs the coordinator's own round machine and relays identity
certificates as the coordinator does):

- without certificates, each device writes a certificate request; once the
  device CA signed them (`fedmask.certs.issue_device_certificates`, what
  `fedmask certs issue-device` runs), an active-mode round commits exactly;
- a coordinator that substitutes one peer's identity key (re-signing that
  peer's advertised keys with a key it holds, so the signature verifies) is
  detected by the devices that see it: they withdraw before sharing any
  secret and never send a masked input, so their inputs are never unmasked.
  Without a device CA the same substitution goes unnoticed (the control);
- a client with a device CA refuses rounds without identity signatures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edge_fake_coordinator import FakeCoordinator, RunningClient, run_async
from fedmask.certs import InitReport, PkiLayout, init_device_ca, issue_device_certificates
from fedmask_proto.v1 import common_pb2, secagg_pb2
from secagg import identity
from secagg.randomness import DeterministicRandom
from wire import RoundIds

USERS = "1-4"


def _pki(tmp_path: Path) -> PkiLayout:
    layout = PkiLayout(tmp_path / "device-ca")
    init_device_ca(layout, InitReport(layout))
    return layout


def _sign_requests(layout: PkiLayout, state: Path) -> list[int]:
    requests = sorted(state.glob("devices/*/identity-csr.pem"))
    return sorted(d for _, d in issue_device_certificates(layout.root, requests))


def _sent(fake: FakeCoordinator, kind: str, round_number: int) -> set[int]:
    """Devices that sent a `kind` stage message in round `round_number`."""
    return {int(getattr(m, kind).device_id) for m in fake.received
            if m.WhichOneof("message") == kind and getattr(m, kind).round_number == round_number}


def _substitute(victim_peer: int, seen_by: set[int], cohort: list[int]) -> Any:
    """A coordinator's tamper: in the AdvertisedKeys of the devices
    `seen_by`, `victim_peer`'s identity key becomes one the coordinator
    holds, and its advertised keys are signed again with it (so that the
    signature check alone passes)."""
    forged = identity.generate_identity(DeterministicRandom(777, "forged identity"))
    sid = RoundIds.from_cohort(sorted(cohort)).secagg(victim_peer)

    def tamper(inner: Any) -> Any:
        if isinstance(inner, secagg_pb2.AdvertisedKeys) and inner.device_id in seen_by:
            for peer in inner.peers:
                if peer.device_id == victim_peer:
                    peer.identity_public_key = identity.public_bytes(forged)
                    peer.signature = identity.sign(forged, identity.advertise_payload(
                        inner.session_id, inner.round_number, sid, peer.c_pk, peer.s_pk))
        return inner

    return tamper


async def _substituted_round(fake: FakeCoordinator, s: Any, ids: list[int]) -> tuple[Any, set[int]]:
    seers = {ids[1], ids[2]}
    bad = await fake.run_round(s, active=True, vector_length=8, tamper=_substitute(ids[0], seers, ids))
    return bad, seers


def test_certificates_are_requested_issued_relayed_and_a_substituted_key_is_refused(tmp_path: Path) -> None:
    layout = _pki(tmp_path)
    state = tmp_path / "client"

    async def go() -> None:
        async with FakeCoordinator() as fake, RunningClient(fake, state, users=USERS,
                                                             device_ca=layout.device_ca_cert):
            s = await fake.wait_stream()
            ids = s.device_ids
            assert len(ids) == 4
            # each device asked for its certificate; the operator signs the requests
            assert _sign_requests(layout, state) == ids
            # an honest active-mode round: every device verified every peer's certificate
            ok = await fake.run_round(s, active=True, vector_length=8)
            assert ok.ok and sorted(ok.counted_devices) == ids
            sent = [m.advertise_keys for m in fake.received if m.WhichOneof("message") == "advertise_keys"]
            assert len(sent) == 4 and all(a.identity_certificate for a in sent)
            # the coordinator substitutes ids[0]'s identity key in what ids[1] and ids[2] see
            bad, seers = await _substituted_round(fake, s, ids)
            n = bad.machine.number
            assert _sent(fake, "share_keys", n).isdisjoint(seers)  # no share of their secrets left them
            assert _sent(fake, "masked_input", n).isdisjoint(seers)  # nor a masked input: nothing to unmask
            reasons = {a.device_id: a.reason for a in bad.aborts}
            assert all(reasons.get(d) == common_pb2.ABORT_REASON_INVALID_SIGNATURE for d in seers), reasons
            assert not set(bad.counted_devices) & seers

    run_async(go())


def test_without_a_device_ca_the_substitution_goes_unnoticed(tmp_path: Path) -> None:
    """The control: the same substitution against a client without a
    device CA; the signature under the substituted key verifies, and the
    devices share their secrets with the forged identity."""

    async def go() -> None:
        async with FakeCoordinator() as fake, RunningClient(fake, tmp_path / "client", users=USERS):
            s = await fake.wait_stream()
            ids = s.device_ids
            bad, seers = await _substituted_round(fake, s, ids)
            assert seers <= _sent(fake, "share_keys", bad.machine.number)

    run_async(go())


def test_a_device_ca_client_refuses_rounds_without_signatures(tmp_path: Path) -> None:
    layout = _pki(tmp_path)
    state = tmp_path / "client"

    async def go() -> None:
        async with FakeCoordinator() as fake, RunningClient(fake, state, users=USERS,
                                                             device_ca=layout.device_ca_cert):
            s = await fake.wait_stream()
            _sign_requests(layout, state)
            passive = await fake.run_round(s, active=False, vector_length=8, first_stage_timeout=5.0)
            assert not passive.ok and passive.counted_devices == []
            assert _sent(fake, "advertise_keys", passive.machine.number) == set()
            assert any(a.device_id == 0 and "identity signatures" in a.detail for a in passive.aborts)

    run_async(go())
