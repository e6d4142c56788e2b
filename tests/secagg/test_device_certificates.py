"""Device identity certificates (secagg/device_certificates.py, D33): what a
peer accepts, and the request / issue path of `fedmask certs issue-device`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedmask.certs import (
    InitReport,
    PkiLayout,
    generate_key,
    init_device_ca,
    init_pki,
    issue_device_certificates,
    make_ca,
)
from secagg.device_certificates import (
    certificate_refusal,
    certificate_request,
    device_id_of_request,
    issue_device_certificate,
)

NOW = datetime(2026, 11, 23, tzinfo=UTC)
DER = serialization.Encoding.DER


def _key(i: int) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(bytes([i]) * 32)


def test_a_peer_accepts_only_its_own_cas_certificate_for_that_key_and_device() -> None:
    ca_key, other_key = generate_key(), generate_key()
    ca, other_ca = make_ca(ca_key, now=NOW), make_ca(other_key, now=NOW)
    dev = _key(1)
    pub = dev.public_key().public_bytes_raw()
    good = issue_device_certificate(ca, ca_key, dev.public_key(), 7, now=NOW).public_bytes(DER)
    assert certificate_refusal(good, ca, pub, 7, now=NOW) is None
    assert "not issued by this device's device CA" in (certificate_refusal(good, other_ca, pub, 7, now=NOW) or "")
    assert "names another device" in (certificate_refusal(good, ca, pub, 8, now=NOW) or "")
    substituted = _key(2).public_key().public_bytes_raw()
    assert "another key" in (certificate_refusal(good, ca, substituted, 7, now=NOW) or "")
    assert "not valid now" in (certificate_refusal(good, ca, pub, 7, now=NOW + timedelta(days=900)) or "")
    assert "sent no identity certificate" in (certificate_refusal(b"", ca, pub, 7, now=NOW) or "")
    assert "not DER" in (certificate_refusal(b"\x30\x03junk", ca, pub, 7, now=NOW) or "")
    forged = issue_device_certificate(other_ca, other_key, dev.public_key(), 7, now=NOW).public_bytes(DER)
    assert certificate_refusal(forged, ca, pub, 7, now=NOW) is not None  # a coordinator's own CA does not do
    assert "CA certificate" in (certificate_refusal(ca.public_bytes(DER), ca, pub, 7, now=NOW) or "")


def test_requests_name_the_device_and_prove_the_key(tmp_path: Path) -> None:
    csr = certificate_request(_key(3), 42)
    assert device_id_of_request(csr) == 42
    layout = PkiLayout(tmp_path / "pki")
    report = InitReport(layout)
    init_device_ca(layout, report)
    assert report.created == [layout.device_ca_cert, layout.device_ca_key]
    assert not layout.ca_cert.exists()  # only the device CA: kept apart from the coordinator's
    folder = tmp_path / "state" / "devices" / "user-1"
    folder.mkdir(parents=True)
    (folder / "identity-csr.pem").write_bytes(csr.public_bytes(serialization.Encoding.PEM))
    [(path, device_id)] = issue_device_certificates(layout.root, [folder / "identity-csr.pem"])
    assert (path, device_id) == (folder / "identity-cert.pem", 42)
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(path.read_bytes())
    ca = x509.load_pem_x509_certificate(layout.device_ca_cert.read_bytes())
    pub = _key(3).public_key().public_bytes_raw()
    assert certificate_refusal(cert.public_bytes(DER), ca, pub, 42, now=datetime.now(UTC)) is None
    bogus = folder.parent / "bogus.pem"
    bogus.write_bytes(b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n")
    with pytest.raises(ValueError, match="bogus.pem"):
        issue_device_certificates(layout.root, [bogus])


def test_certs_init_creates_the_device_ca_unless_told_not_to(tmp_path: Path) -> None:
    both = init_pki(tmp_path / "a")
    assert both.layout.device_ca_cert in both.created and both.layout.ca_cert in both.created
    assert both.layout.device_ca_cert.read_bytes() != both.layout.ca_cert.read_bytes()
    without = init_pki(tmp_path / "b", device_ca=False)
    assert not without.layout.device_ca_cert.exists()
