"""Device identity certificates: a device's Ed25519 identity key bound to its
device id by a device CA that is not the coordinator's (D33).

In active-adversary mode peers verify signatures under identity keys that
the coordinator relays; a coordinator that substitutes a key could then
impersonate a peer. With a device CA, every device sends its certificate
with its advertised keys, and each peer checks it against the device CA
certificate it was configured with itself (never one received from the
coordinator):

- the certificate is signed by that CA and within its validity;
- it is a leaf (basicConstraints CA false) for digital signatures;
- its subject key is an Ed25519 key equal to the identity key the
  signatures are verified under;
- its subject CN names the claimed device: "fedmask-device-<device id>".

Pure functions over bytes and `cryptography` objects (no files, no I/O):
`fedmask certs` issues, the edge client and the coordinator verify.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import NameOID

DEVICE_CN_PREFIX = "fedmask-device-"
#: Largest certificate a peer accepts (a P-256-signed Ed25519 leaf is ~450 bytes).
MAX_CERTIFICATE_BYTES = 4096
DEVICE_CERT_VALIDITY = timedelta(days=825)
CLOCK_SKEW = timedelta(minutes=5)


def device_common_name(device_id: int) -> str:
    return f"{DEVICE_CN_PREFIX}{device_id}"


def _common_name(name: x509.Name) -> str | None:
    attrs = name.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(attrs) != 1:
        return None
    value = attrs[0].value
    return value if isinstance(value, str) else None


def device_id_of_request(csr: x509.CertificateSigningRequest) -> int:
    """The device id a certificate request names (its CN); ValueError when
    the request is not a valid, self-signed request for an Ed25519 key and
    a "fedmask-device-<id>" name."""
    if not csr.is_signature_valid:
        raise ValueError("the request's signature does not verify (not made with its key)")
    if not isinstance(csr.public_key(), Ed25519PublicKey):
        raise ValueError("the request's key is not an Ed25519 identity key")
    cn = _common_name(csr.subject)
    if cn is None or not cn.startswith(DEVICE_CN_PREFIX) or not cn[len(DEVICE_CN_PREFIX):].isdigit():
        raise ValueError(f"the request's CN must be {DEVICE_CN_PREFIX}<device id>, got {cn!r}")
    device_id = int(cn[len(DEVICE_CN_PREFIX):])
    if device_id < 1:
        raise ValueError("the device id must be >= 1")
    return device_id


def certificate_request(identity_key: Ed25519PrivateKey, device_id: int) -> x509.CertificateSigningRequest:
    """The device's request (CSR) for its identity certificate, signed by
    the identity key itself (the CA sees that the requester holds it)."""
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, device_common_name(device_id))])
    return x509.CertificateSigningRequestBuilder().subject_name(subject).sign(identity_key, None)


def leaf_certificate_builder(ca_cert: x509.Certificate, subject: x509.Name, public_key: CertificatePublicKeyTypes, *,
                             now: datetime, validity: timedelta, key_agreement: bool) -> x509.CertificateBuilder:
    """What every leaf certificate a CA of the federation issues has (this
    module's device certificates, and `fedmask certs`' TLS ones): `subject`
    and `public_key`, issued by `ca_cert`, a random serial, valid from `now`
    less CLOCK_SKEW to `now + validity` but never past the CA's own expiry;
    basicConstraints CA false and key usage digital signature (and key
    agreement when `key_agreement`), both critical. The caller adds its own
    extensions after these and signs."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(min(now + validity, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=key_agreement, key_cert_sign=False, crl_sign=False,
                          encipher_only=False, decipher_only=False),
            critical=True,
        )
    )


def issue_device_certificate(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey,
                             identity_public: Ed25519PublicKey, device_id: int, *, now: datetime) -> x509.Certificate:
    """The device CA's certificate binding `identity_public` to `device_id`."""
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, device_common_name(device_id))])
    return (
        leaf_certificate_builder(ca_cert, subject, identity_public, now=now, validity=DEVICE_CERT_VALIDITY,
                                 key_agreement=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def certificate_refusal(der: bytes, ca: x509.Certificate, identity_public: bytes, device_id: int, *,
                        now: datetime) -> str | None:
    """None when `der` is a device certificate the CA `ca` issued for
    `device_id` and the raw Ed25519 key `identity_public`, valid at `now`;
    otherwise why not (names only `device_id`)."""
    who = f"device {device_id}"
    if not der:
        return f"{who} sent no identity certificate"
    if len(der) > MAX_CERTIFICATE_BYTES:
        return f"{who}'s identity certificate is over {MAX_CERTIFICATE_BYTES} bytes"
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError:
        return f"{who}'s identity certificate is not DER X.509"
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return f"{who}'s identity certificate is not issued by this device's device CA"
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        return f"{who}'s identity certificate is not valid now"
    try:
        basic = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return f"{who}'s identity certificate has no basicConstraints"
    if basic.ca:
        return f"{who}'s identity certificate is a CA certificate"
    key = cert.public_key()
    if not isinstance(key, Ed25519PublicKey) or key.public_bytes_raw() != identity_public:
        return f"{who}'s identity certificate is for another key than its identity key"
    if _common_name(cert.subject) != device_common_name(device_id):
        return f"{who}'s identity certificate names another device"
    return None


__all__ = [
    "DEVICE_CN_PREFIX",
    "MAX_CERTIFICATE_BYTES",
    "certificate_refusal",
    "certificate_request",
    "device_common_name",
    "device_id_of_request",
    "issue_device_certificate",
    "leaf_certificate_builder",
]
