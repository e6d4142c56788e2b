"""The protocol vocabulary both sides share, each name defined once here.

- `PROTOCOL_VERSION` and the version rule (`version_refusal`).
- Which proto stage message belongs to which `secagg.stages.Stage`, on each
  side of the Session stream.
- The RoundTask hyper-parameter names the coordinator and the edge client
  agree on.
- The default cap on a top-k request's k (`DEFAULT_MAX_TOP_K`, D84).
- Message-size constants, from which the coordinator's gRPC receive limit is
  computed (`coordinator.server.max_receive_message_bytes`).
- `is_loopback`: the one test of "this address never leaves the machine"
  that guards every debug-only and insecure option.

How the protocol version evolves
--------------------------------
A version is "fedmask.v<MAJOR>.<MINOR>" (the bare "fedmask.v1" of the first
release reads as 1.0). A MINOR bump adds messages or fields that an older
peer may ignore, and the coordinator keeps serving clients of the previous
minor versions listed in `SERVED_CLIENT_VERSIONS`. A MAJOR bump changes what
an existing message means; the coordinator then serves its own major only.
A client whose version is not served is refused at Hello with
FAILED_PRECONDITION and a message that names both versions and says to
upgrade the client (`version_refusal`); a client that hears a Welcome from
a coordinator it does not understand (another major) stops with the same
advice (`coordinator_refusal`). An empty version (a client built before
versions were sent) is served as the oldest served version.
"""

from __future__ import annotations

import ipaddress
import re

from fedmask_proto.v1 import secagg_pb2
from secagg.messages import PUBLIC_KEY_BYTES, SIGNATURE_BYTES
from secagg.server.share_keys import SEALED_SHARES_BYTES, sealed_shares_bytes  # a sealed blob's size is secagg's
from secagg.shamir import ELEMENT_BYTES
from secagg.stages import Stage

# --------------------------------------------------------------------------- versions

#: The version this code speaks.
PROTOCOL_VERSION = "fedmask.v1.3"
#: Client versions the coordinator serves (the current one first). 1.1
#: added the share check (ShareReceipt, MaskingRequest), changed what a
#: device's masked input holds (metric coordinates after the update,
#: RoundTask.metric_names), removed RoundMetrics and made devices prove
#: possession of their identity key at enrolment and on every Session stream
#: (D32), so a 1.0 client cannot take part in a round and is refused at Hello.
#: 1.2 added DpSettings.mechanism and the discrete Gaussian's fields (D88):
#: under it a masked input is the rotated update's residues mod 2^w, d'
#: coordinates. A 1.1 client would ignore the mechanism and send float
#: noise in the fixed-point encoding, so it is refused at Hello too.
#: 1.3 added SecaggSettings.encoding_cohort_size (D99): a round in groups
#: sends each group's devices the whole cohort's encoding. A 1.2 client would
#: encode at its group's scale and the groups' sums could wrap: refused too.
SERVED_CLIENT_VERSIONS: tuple[str, ...] = (PROTOCOL_VERSION,)
#: Printed and logged versions are cut to this many characters.
MAX_VERSION_CHARS = 64

_VERSION = re.compile(r"^fedmask\.v(\d{1,4})(?:\.(\d{1,4}))?$")


def parse_version(text: str) -> tuple[int, int] | None:
    """"fedmask.v1" -> (1, 0), "fedmask.v1.2" -> (1, 2); None if malformed."""
    m = _VERSION.match(text)
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2) or 0)


def version_refusal(client_version: str) -> str | None:
    """None when the coordinator serves a client speaking `client_version`;
    otherwise the message to refuse it with (names both versions, says to
    upgrade or which side is newer; the client's text is cut and quoted)."""
    if not client_version or client_version in SERVED_CLIENT_VERSIONS:
        return None
    shown = ascii(client_version[:MAX_VERSION_CHARS])
    mine = parse_version(PROTOCOL_VERSION)
    theirs = parse_version(client_version)
    assert mine is not None
    if theirs is None:
        return f"unknown protocol version {shown}; this coordinator speaks {PROTOCOL_VERSION}"
    if theirs < mine:
        return (f"client protocol {shown} is too old for this coordinator ({PROTOCOL_VERSION}): "
                "upgrade the edge client")
    return (f"client protocol {shown} is newer than this coordinator's ({PROTOCOL_VERSION}): "
            "upgrade the coordinator or run an older client")


def coordinator_refusal(coordinator_version: str) -> str | None:
    """Client side: None when this client can talk to a coordinator that
    speaks `coordinator_version` (same major), else the message to stop with."""
    mine = parse_version(PROTOCOL_VERSION)
    theirs = parse_version(coordinator_version) if coordinator_version else mine
    assert mine is not None
    if theirs is not None and theirs[0] == mine[0]:
        return None
    shown = ascii(coordinator_version[:MAX_VERSION_CHARS])
    return f"the coordinator speaks protocol {shown}, this client {PROTOCOL_VERSION}: upgrade the edge client"


# --------------------------------------------------------------------------- stages

#: Client -> server proto stage message -> the stage it answers.
CLIENT_MESSAGE_STAGE: dict[type, Stage] = {
    secagg_pb2.AdvertiseKeys: Stage.ADVERTISE_KEYS,
    secagg_pb2.ShareKeys: Stage.SHARE_KEYS,
    secagg_pb2.ShareReceipt: Stage.SHARE_CHECK,
    secagg_pb2.MaskedInput: Stage.MASKED_INPUT,
    secagg_pb2.ConsistencyCheck: Stage.CONSISTENCY_CHECK,
    secagg_pb2.UnmaskingResponse: Stage.UNMASKING,
}
#: ServerMessage oneof field of a server stage message -> the stage whose
#: client reply it asks for (the RoundTask asks for ADVERTISE_KEYS).
SERVER_FIELD_STAGE: dict[str, Stage] = {
    "advertised_keys": Stage.SHARE_KEYS,
    "forwarded_shares": Stage.SHARE_CHECK,
    "masking_request": Stage.MASKED_INPUT,
    "consistency_check_request": Stage.CONSISTENCY_CHECK,
    "unmasking_request": Stage.UNMASKING,
}

# --------------------------------------------------------------------------- RoundTask hyper-parameters

#: INSECURE debug mode (benchmark baseline): devices upload their encoded
#: update unmasked; both sides must opt in, loopback only.
PLAINTEXT_HYPERPARAMETER = "insecure_plaintext"
#: FedMMF hybrid rounds (UNPROTECTED updates, D64): the coordinator's bound
#: on the privacy indicator J under which a device may send its encoded
#: update in plaintext (a MaskedInput during ADVERTISE_KEYS); absent: every
#: device is secure.
HYBRID_J_BOUND_HYPERPARAMETER = "unprotected_plaintext_j_bound"
#: The model's training step (round index of the curriculum).
ROUND_INDEX_HYPERPARAMETER = "round_idx"

#: gRPC's retry-pushback trailer: milliseconds a refused client should wait
#: before it tries again (set with every rate-limit refusal; the edge
#: client waits that long instead of its own backoff).
RETRY_PUSHBACK_KEY = "grpc-retry-pushback-ms"

# --------------------------------------------------------------------------- top-k

#: The default cap on a top-k request's k (D84), the same on every side: the
#: admin service (max_top_k), the coordinator (admin.max_top_k) and the
#: device (`fedmask client --max-top-k`). Each enforces its own setting.
DEFAULT_MAX_TOP_K = 100
#: The largest cap any side may be configured with.
MAX_TOP_K_LIMIT = 10_000

# --------------------------------------------------------------------------- sizes

#: A masked input travels as little-endian uint32 words.
MASKED_ELEMENT_BYTES = 4
#: Ceiling of a MaskedInput's fields other than its vector (ids, session, tags).
MASKED_INPUT_OVERHEAD_BYTES = 256
#: One EncryptedShare on the wire: the ciphertext, two varint ids, tags.
ENCRYPTED_SHARE_WIRE_BYTES = SEALED_SHARES_BYTES + 24
#: One share in an UnmaskingResponse: a field element plus id and tags.
UNMASKING_SHARE_WIRE_BYTES = ELEMENT_BYTES + 16
#: One ComponentShare (removable noise): a field element, an id, a component number, tags.
COMPONENT_SHARE_WIRE_BYTES = ELEMENT_BYTES + 24
#: Identity (Ed25519) public key, as enrolled.
IDENTITY_KEY_BYTES = 32
__all__ = [
    "CLIENT_MESSAGE_STAGE",
    "COMPONENT_SHARE_WIRE_BYTES",
    "ENCRYPTED_SHARE_WIRE_BYTES",
    "IDENTITY_KEY_BYTES",
    "MASKED_ELEMENT_BYTES",
    "MASKED_INPUT_OVERHEAD_BYTES",
    "MAX_VERSION_CHARS",
    "HYBRID_J_BOUND_HYPERPARAMETER",
    "PLAINTEXT_HYPERPARAMETER",
    "PROTOCOL_VERSION",
    "PUBLIC_KEY_BYTES",
    "RETRY_PUSHBACK_KEY",
    "ROUND_INDEX_HYPERPARAMETER",
    "SEALED_SHARES_BYTES",
    "sealed_shares_bytes",
    "SERVED_CLIENT_VERSIONS",
    "SERVER_FIELD_STAGE",
    "SIGNATURE_BYTES",
    "UNMASKING_SHARE_WIRE_BYTES",
    "coordinator_refusal",
    "is_loopback",
    "is_loopback_target",
    "parse_version",
    "version_refusal",
]


# --------------------------------------------------------------------------- addresses


def is_loopback(host: str) -> bool:
    """True for "localhost" and loopback IP literals (127.0.0.0/8, ::1);
    brackets around an IPv6 literal are accepted."""
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback_target(target: str) -> bool:
    """A gRPC target "host:port" / "[v6]:port" (an optional "dns:" or
    "ipv4:"/"ipv6:" scheme is dropped) on a loopback address."""
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if target.startswith(scheme):
            target = target[len(scheme):]
            break
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        host = target
    return is_loopback(host)
