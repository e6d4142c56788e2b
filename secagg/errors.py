"""Errors and typed reasons.

Two families, kept apart on purpose (the fcp/secagg convention):

* Exceptions are for the *caller* of this library: a bad configuration, a
  state used twice, a handler given something that is not a message. They
  mean "the code driving the protocol is wrong" and are raised.
* `AbortReason` / `DropReason` describe *peer* misbehaviour or too few live
  devices. They are data, carried by the Aborted states and by the server's
  record of dropped devices; they are never raised.

`DecryptionError` is the one exception a protocol step raises internally on
a peer's data: every AEAD failure (bad tag, wrong key, wrong associated data,
truncated blob) is this single opaque error with no message and no cause, so
nothing about the failure leaks through error text or timing of different
code paths (the pyca/cryptography `InvalidTag` convention).
"""

from __future__ import annotations

import enum


class SecAggError(Exception):
    """Base class of every exception this package raises."""


class SecAggConfigError(SecAggError, ValueError):
    """A secure-aggregation configuration that cannot run safely or correctly.

    Not to be confused with `models.registry.ConfigError` (a
    simulation's settings)."""


class EncodingRangeError(SecAggConfigError):
    """The fixed-point encoding would need more than the allowed bits: the sum
    of the cohort's inputs could wrap around the modulus."""


class ProtocolMisuse(SecAggError, RuntimeError):
    """The caller drove a state machine wrongly (a spent or terminal state,
    a sender outside the cohort, an input of the wrong shape...)."""


class MalformedMessage(SecAggError, ValueError):
    """Bytes or a message object that do not follow the wire format."""


class DecryptionError(SecAggError):
    """Opaque: authenticated decryption failed. Carries no detail by design."""

    def __init__(self) -> None:
        super().__init__()


class AbortReason(enum.Enum):
    """Why a round (server) or a device's participation (client) ended early."""

    # Server side: too few live devices to go on (Bonawitz: |U_i| < t).
    TOO_FEW_ADVERTISED = "too_few_advertised"
    TOO_FEW_SHARED = "too_few_shared"
    TOO_FEW_MASKED_INPUTS = "too_few_masked_inputs"
    TOO_FEW_SIGNATURES = "too_few_signatures"
    TOO_FEW_UNMASKING_RESPONSES = "too_few_unmasking_responses"
    RECONSTRUCTION_FAILED = "reconstruction_failed"
    CANCELLED = "cancelled"
    # Client side: the server (or a peer through it) misbehaved.
    SERVER_ABORTED = "server_aborted"
    WRONG_SESSION_OR_ROUND = "wrong_session_or_round"
    UNEXPECTED_MESSAGE = "unexpected_message"
    MALFORMED_MESSAGE = "malformed_message"
    INVALID_KEY_LIST = "invalid_key_list"
    INVALID_SHARE_RELAY = "invalid_share_relay"
    INVALID_CONSISTENCY_REQUEST = "invalid_consistency_request"
    INVALID_UNMASKING_REQUEST = "invalid_unmasking_request"
    INVALID_SIGNATURE = "invalid_signature"
    # Added with the share check (wire codes follow the order above, so new
    # reasons go last).
    TOO_FEW_CHECKED = "too_few_checked"  # server: too few devices left after the share check
    SHARES_UNDECRYPTABLE = "shares_undecryptable"  # notice: a peer could not open this device's shares
    INVALID_MASKING_REQUEST = "invalid_masking_request"  # client: a bad MaskingRequest


class DropReason(enum.Enum):
    """Why the server stopped counting on one device (the round goes on)."""

    CLIENT_ABORTED = "client_aborted"
    WRONG_SESSION_OR_ROUND = "wrong_session_or_round"
    SPOOFED_SENDER = "spoofed_sender"
    UNEXPECTED_MESSAGE = "unexpected_message"
    DUPLICATE_MESSAGE = "duplicate_message"
    MALFORMED_MESSAGE = "malformed_message"
    INVALID_SIGNATURE = "invalid_signature"
    NEIGHBOURHOOD_TOO_SMALL = "neighbourhood_too_small"
    TOO_FEW_SIGNERS_NEARBY = "too_few_signers_nearby"
    # A peer reported that this device's relayed shares did not decrypt; the
    # device is left out of this round before anyone masks with it.
    REPORTED_UNDECRYPTABLE = "reported_undecryptable"


# One byte on the wire for each reason (ClientAbort / ServerAbort messages).
ABORT_REASON_CODES: dict[AbortReason, int] = {r: i for i, r in enumerate(AbortReason)}
ABORT_REASON_BY_CODE: dict[int, AbortReason] = {i: r for r, i in ABORT_REASON_CODES.items()}
