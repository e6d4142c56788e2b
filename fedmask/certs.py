"""A small private PKI for a federation: one CA, the coordinator's server
certificate and one client certificate per edge client ("device").

Used by `fedmask certs init` and by tests; both the coordinator and edge
clients only read the PEM files it writes (so it lives in neither package).

Choices: EC P-256 keys, ECDSA-SHA256 signatures (supported by every gRPC TLS
stack); CA valid 10 years, leaf certificates 825 days; not_before backdated 5
minutes for clock skew. Private keys are unencrypted PKCS#8 PEM with mode
0600; certificates PEM with mode 0644.

Layout written by `init_pki(DIR, ...)`:
    DIR/ca.pem  DIR/ca.key                       the federation CA
    DIR/coordinator.pem  DIR/coordinator.key     server cert (serverAuth)
    DIR/devices/device-0001.pem  .key ...        client certs (clientAuth), CN = file stem
    DIR/device-ca.pem  DIR/device-ca.key         the DEVICE CA (D33): signs device identity
                                                 certificates; keep device-ca.key away from
                                                 the coordinator (`init --device-ca-only` on
                                                 another machine creates only this pair)

`issue_device_certificates(DIR, csr_paths)` signs devices' certificate
requests with the device CA (`fedmask certs issue-device`): each request
must be self-signed by an Ed25519 identity key and name
"fedmask-device-<id>"; the certificate is written next to it as
identity-cert.pem, where the edge client reads it.

Written by `issue_admin(DIR, NAME)` (`fedmask certs issue-admin`):
    DIR/admins/NAME.pem  .key                    admin client cert: CN = NAME, OU = ADMIN_ROLE
The coordinator's admin listener (admin.auth "mtls") accepts only client
certificates whose subject OU is ADMIN_ROLE, and its device listener
refuses them (coordinator/admin_auth.py).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from secagg.device_certificates import (
    CLOCK_SKEW,
    device_id_of_request,
    issue_device_certificate,
    leaf_certificate_builder,
)

ORGANIZATION = "fedmask"
#: The subject OU of admin client certificates (coordinator.admin_auth.ADMIN_ROLE).
ADMIN_ROLE = "admin"
CA_VALIDITY = timedelta(days=3650)
LEAF_VALIDITY = timedelta(days=825)
DEFAULT_SERVER_HOSTS = ("localhost", "127.0.0.1", "::1")


def generate_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str, role: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION)]
    if role is not None:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role))
    return x509.Name([*attributes, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san_entries(hosts: Iterable[str]) -> list[x509.GeneralName]:
    entries: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):  # de-duplicated, order kept
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            entries.append(x509.DNSName(host))
    return entries


def make_ca(key: ec.EllipticCurvePrivateKey, *, common_name: str = "fedmask federation CA",
            now: datetime | None = None) -> x509.Certificate:
    """A self-signed CA certificate that may only sign leaf certificates."""
    now = now or datetime.now(UTC)
    public = key.public_key()
    return (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                          encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )


def issue_leaf(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    key: ec.EllipticCurvePrivateKey,
    *,
    common_name: str,
    server_hosts: Sequence[str] = (),
    client: bool = False,
    role: str | None = None,
    now: datetime | None = None,
) -> x509.Certificate:
    """A leaf certificate signed by the CA: a server certificate when
    `server_hosts` is given (SAN = those hosts), a client one when `client`;
    `role` becomes the subject's OU (ADMIN_ROLE for admin certificates)."""
    if not server_hosts and not client:
        raise ValueError("a leaf certificate must be for a server, a client or both")
    now = now or datetime.now(UTC)
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server_hosts else []) + (
        [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    )
    builder = (
        leaf_certificate_builder(ca_cert, _name(common_name, role), key.public_key(), now=now, validity=LEAF_VALIDITY,
                                 key_agreement=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if server_hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName(_san_entries(server_hosts)), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


# ------------------------------------------------------------------ files
def write_private_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """PKCS#8 PEM, created with mode 0600 (never world-readable, not even briefly)."""
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, pem)
    finally:
        os.close(fd)


def write_certificate(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    path.chmod(0o644)


def load_certificate(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def load_private_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{path}: expected an EC private key")
    return key


def san_hosts(cert: x509.Certificate) -> set[str]:
    """DNS names and IP addresses of a certificate's SAN (as strings)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(san.get_values_for_type(x509.DNSName)) | {
        str(ip) for ip in san.get_values_for_type(x509.IPAddress)
    }


# ----------------------------------------------------------------- layout
@dataclass(frozen=True)
class PkiLayout:
    """Paths of a federation PKI directory."""

    root: Path

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def server_cert(self) -> Path:
        return self.root / "coordinator.pem"

    @property
    def server_key(self) -> Path:
        return self.root / "coordinator.key"

    @property
    def device_ca_cert(self) -> Path:
        return self.root / "device-ca.pem"

    @property
    def device_ca_key(self) -> Path:
        return self.root / "device-ca.key"

    @property
    def devices_dir(self) -> Path:
        return self.root / "devices"

    @property
    def admins_dir(self) -> Path:
        return self.root / "admins"

    def admin(self, name: str) -> tuple[Path, Path]:
        """(certificate, key) of the admin client `name`."""
        return self.admins_dir / f"{name}.pem", self.admins_dir / f"{name}.key"

    def device(self, index: int) -> tuple[Path, Path]:
        """(certificate, key) of device number `index` (1-based)."""
        stem = device_name(index)
        return self.devices_dir / f"{stem}.pem", self.devices_dir / f"{stem}.key"


def device_name(index: int) -> str:
    return f"device-{index:04d}"


@dataclass
class InitReport:
    layout: PkiLayout
    created: list[Path] = field(default_factory=list)
    kept: list[Path] = field(default_factory=list)


def init_device_ca(layout: PkiLayout, report: InitReport, *, force: bool = False,
                   now: datetime | None = None) -> None:
    """Create the device CA in `layout` unless it exists (or `force`)."""
    if not layout.root.exists():
        layout.root.mkdir(mode=0o700, parents=True)
    if not force and layout.device_ca_cert.exists() and layout.device_ca_key.exists():
        report.kept += [layout.device_ca_cert, layout.device_ca_key]
        return
    key = generate_key()
    write_private_key(layout.device_ca_key, key)
    write_certificate(layout.device_ca_cert, make_ca(key, common_name="fedmask device CA", now=now))
    report.created += [layout.device_ca_cert, layout.device_ca_key]


def issue_device_certificates(directory: Path, requests: Sequence[Path], *,
                              now: datetime | None = None) -> list[tuple[Path, int]]:
    """Sign each certificate request (PEM CSR) with the device CA of
    `directory`; the certificate goes next to the request as
    identity-cert.pem. Returns (certificate path, device id) per request.
    ValueError naming the file for a request that is not a device's."""
    layout = PkiLayout(Path(directory))
    ca_key, ca_cert = load_private_key(layout.device_ca_key), load_certificate(layout.device_ca_cert)
    out: list[tuple[Path, int]] = []
    for path in requests:
        try:
            csr = x509.load_pem_x509_csr(Path(path).read_bytes())
            device_id = device_id_of_request(csr)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
        identity_public = csr.public_key()
        assert isinstance(identity_public, Ed25519PublicKey)  # device_id_of_request checked it
        cert = issue_device_certificate(ca_cert, ca_key, identity_public, device_id, now=now or datetime.now(UTC))
        target = Path(path).with_name("identity-cert.pem")
        write_certificate(target, cert)
        out.append((target, device_id))
    return out


def init_pki(
    directory: Path,
    *,
    devices: int = 0,
    coordinator_host: str = "localhost",
    force: bool = False,
    now: datetime | None = None,
    device_ca: bool = True,
) -> InitReport:
    """Create (or complete) a federation PKI in `directory`.

    Idempotent: an existing CA is reused and existing certificates are kept;
    missing device certificates 1..`devices` are added, and the server
    certificate is reissued when its SAN lacks a requested host. A new CA
    (first run, or `force`) reissues everything.
    """
    if devices < 0:
        raise ValueError("devices must be >= 0")
    layout = PkiLayout(Path(directory))
    report = InitReport(layout)
    if not layout.root.exists():
        layout.root.mkdir(mode=0o700, parents=True)  # an existing directory keeps its mode
    layout.devices_dir.mkdir(mode=0o700, exist_ok=True)

    new_ca = force or not (layout.ca_cert.exists() and layout.ca_key.exists())
    if new_ca:
        ca_key = generate_key()
        ca_cert = make_ca(ca_key, now=now)
        write_private_key(layout.ca_key, ca_key)
        write_certificate(layout.ca_cert, ca_cert)
        report.created += [layout.ca_cert, layout.ca_key]
    else:
        ca_key, ca_cert = load_private_key(layout.ca_key), load_certificate(layout.ca_cert)
        report.kept += [layout.ca_cert, layout.ca_key]

    hosts = [*DEFAULT_SERVER_HOSTS, coordinator_host]
    server_ok = (
        not new_ca
        and layout.server_cert.exists()
        and layout.server_key.exists()
        and set(hosts) <= san_hosts(load_certificate(layout.server_cert))
    )
    if server_ok:
        report.kept += [layout.server_cert, layout.server_key]
    else:
        key = generate_key()
        cert = issue_leaf(ca_cert, ca_key, key, common_name=coordinator_host, server_hosts=hosts, now=now)
        write_private_key(layout.server_key, key)
        write_certificate(layout.server_cert, cert)
        report.created += [layout.server_cert, layout.server_key]

    for index in range(1, devices + 1):
        cert_path, key_path = layout.device(index)
        if not new_ca and cert_path.exists() and key_path.exists():
            report.kept += [cert_path, key_path]
            continue
        key = generate_key()
        cert = issue_leaf(ca_cert, ca_key, key, common_name=device_name(index), client=True, now=now)
        write_private_key(key_path, key)
        write_certificate(cert_path, cert)
        report.created += [cert_path, key_path]
    if device_ca:
        init_device_ca(layout, report, force=force, now=now)
    return report


def issue_admin(directory: Path, name: str, *, now: datetime | None = None) -> tuple[Path, Path]:
    """Issue (or re-issue) the admin client certificate `name` with the CA of
    the PKI in `directory` (made by `init_pki`): CN = name, OU = ADMIN_ROLE.
    Returns (certificate, key) paths. ValueError for a bad name or a
    directory without a CA."""
    if not name or len(name) > 64 or not all(c.isalnum() or c in "-_." for c in name) or name.startswith("."):
        raise ValueError("admin name: 1..64 letters, digits, '-', '_' or '.', not starting with '.'")
    layout = PkiLayout(Path(directory))
    if not (layout.ca_cert.exists() and layout.ca_key.exists()):
        raise ValueError(f"{directory} holds no CA (run `fedmask certs init {directory}` first)")
    ca_key, ca_cert = load_private_key(layout.ca_key), load_certificate(layout.ca_cert)
    layout.admins_dir.mkdir(mode=0o700, exist_ok=True)
    key = generate_key()
    cert = issue_leaf(ca_cert, ca_key, key, common_name=name, client=True, role=ADMIN_ROLE, now=now)
    cert_path, key_path = layout.admin(name)
    write_private_key(key_path, key)
    write_certificate(cert_path, cert)
    return cert_path, key_path
