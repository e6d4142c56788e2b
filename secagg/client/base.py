"""What every client (device) state shares, and the two terminal states.

A client state is single use: `handle(message)` returns `(next_state,
messages_to_send)` and the state it was called on is spent (calling it again
raises ProtocolMisuse). Every message a client sends goes to the server.

Errors, by who is at fault:
- the caller (not a Message, a spent state, bad constructor arguments):
  TypeError / ValueError / ProtocolMisuse are raised;
- the server or a peer (another session or round, an unexpected message type,
  a failed check): the device moves to `ClientAborted` with an AbortReason
  and tells the server with a `ClientAbort` message;
- the server aborting the round (`ServerAbort`): `ClientAborted(SERVER_ABORTED)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Never, TypeVar

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secagg.config import SecAggConfig
from secagg.errors import AbortReason, MalformedMessage, ProtocolMisuse
from secagg.graph import CommunicationGraph
from secagg.keys import KeyPair
from secagg.messages import ClientAbort, KeyEntry, Message, ServerAbort
from secagg.randomness import RandomSource

Transition = tuple["ClientState[Any]", list[Message]]

# The message type a state accepts (Never for the initial and terminal states).
M = TypeVar("M", bound=Message)


class Reject(Exception):
    """Raised inside a handler when the server's message fails a check; the
    base class turns it into ClientAborted(reason) (never escapes)."""

    def __init__(self, reason: AbortReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(slots=True, eq=False)
class ClientRound:
    """The device's private state for one round, handed from state to state.
    Never leaves the device."""

    config: SecAggConfig
    device_id: int
    round_idx: int
    rand: RandomSource
    graph: CommunicationGraph
    encoded_input: np.ndarray | None  # dropped once masked
    identity_key: Ed25519PrivateKey | None = None
    peer_identity_keys: Mapping[int, bytes] | None = None
    c_pair: KeyPair | None = None
    s_pair: KeyPair | None = None
    # From the KeyList: the advertised peers of the closure (self excluded).
    peers: dict[int, KeyEntry] = field(default_factory=dict)
    b_seed: bytes = b""
    own_b_share: int = 0
    receive_keys: dict[int, bytes] = field(default_factory=dict)  # peer -> key of peer->self
    # From the ShareRelay: whose shares were relayed to us (we mask with them),
    # their decrypted (b-share, s-share), and those that failed to decrypt.
    relayed: frozenset[int] = frozenset()
    # From the MaskingRequest: the peers we mask with (relayed ones the share
    # check kept); the unmasking request may only name these.
    masked_with: frozenset[int] | None = None
    held: dict[int, tuple[int, int]] = field(default_factory=dict)
    # Removable noise (config.removable_noise): this device's m component
    # seeds (given at the start, components 1..m), its own share of each, and
    # each peer's m shares held after the share check.
    removable_seeds: tuple[bytes, ...] = ()
    own_component_shares: tuple[int, ...] = ()
    held_components: dict[int, tuple[int, ...]] = field(default_factory=dict)
    undecryptable: frozenset[int] = frozenset()
    signed_alive: frozenset[int] | None = None  # active mode: the U3 we signed

    # Typed reads of the fields set along the way; each raises ProtocolMisuse
    # if read before the stage that sets it.

    def input(self) -> np.ndarray:
        return _known(self.encoded_input, "the encoded input (dropped once masked)")

    def c_keys(self) -> KeyPair:
        return _known(self.c_pair, "the c key pair (made at AdvertiseKeys)")

    def s_keys(self) -> KeyPair:
        return _known(self.s_pair, "the s key pair (made at AdvertiseKeys)")

    def masking_peers(self) -> frozenset[int]:
        return _known(self.masked_with, "the masking peers (set at MaskedInputCollection)")

    def signing_key(self) -> Ed25519PrivateKey:
        return _known(self.identity_key, "the identity key (active-adversary mode)")

    def peer_identity_key(self, device: int) -> bytes | None:
        """`device`'s identity public key (None if unknown); active mode only."""
        return _known(self.peer_identity_keys, "the peers' identity keys (active-adversary mode)").get(device)

    def signed(self) -> frozenset[int]:
        return _known(self.signed_alive, "the signed survivor set (active-adversary mode)")


_T = TypeVar("_T")


def _known(value: _T | None, what: str) -> _T:
    if value is None:
        raise ProtocolMisuse(f"{what} is not available at this stage")
    return value


class ClientState(Generic[M]):
    """Base of the client states; see the module doc for the contract."""

    #: The Stage this state collects (a plain str on the terminal states).
    stage: ClassVar[str] = ""
    # The message class of the state (== M); None where no message is expected.
    expects: type[M] | None = None

    __slots__ = ("_round", "_spent")

    def __init__(self, rnd: ClientRound) -> None:
        self._round = rnd
        self._spent = False

    @property
    def device_id(self) -> int:
        return self._round.device_id

    @property
    def round_idx(self) -> int:
        return self._round.round_idx

    @property
    def config(self) -> SecAggConfig:
        return self._round.config

    @property
    def is_terminal(self) -> bool:
        return False

    def _use(self) -> None:
        if self._spent:
            raise ProtocolMisuse(f"{type(self).__name__} was already used; continue with the state it returned")
        self._spent = True

    def handle(self, message: Message) -> Transition:
        """Process one server message; returns (next_state, messages to send)."""
        if not isinstance(message, Message):
            raise TypeError(f"expected a secagg Message, got {type(message).__name__}")
        self._use()
        r = self._round
        if message.session_id != r.config.session_id or message.round_idx != r.round_idx:
            return self._abort(AbortReason.WRONG_SESSION_OR_ROUND, "message from another session or round")
        if message.device_id != r.device_id:
            return self._abort(AbortReason.MALFORMED_MESSAGE, "message addressed to another device")
        if isinstance(message, ServerAbort):
            return ClientAborted(r, AbortReason.SERVER_ABORTED, f"server: {message.reason.value}", self.stage), []
        if self.expects is None or not isinstance(message, self.expects):
            return self._abort(AbortReason.UNEXPECTED_MESSAGE, f"{type(message).__name__} during {self.stage}")
        try:
            return self._on_message(message)
        except Reject as rej:
            return self._abort(rej.reason, rej.detail)
        except MalformedMessage as exc:
            return self._abort(AbortReason.MALFORMED_MESSAGE, str(exc))

    def _on_message(self, message: M) -> Transition:  # pragma: no cover - abstract
        raise NotImplementedError

    def abort(self, reason: AbortReason = AbortReason.CANCELLED, detail: str = "cancelled by the device") -> Transition:
        """The device leaves the round on its own (e.g. the user cancelled)."""
        self._use()
        return self._abort(reason, detail)

    def _abort(self, reason: AbortReason, detail: str) -> Transition:
        r = self._round
        msg = ClientAbort(session_id=r.config.session_id, round_idx=r.round_idx, device_id=r.device_id, reason=reason)
        return ClientAborted(r, reason, detail, self.stage), [msg]

    def _header(self) -> dict[str, Any]:
        r = self._round
        return {"session_id": r.config.session_id, "round_idx": r.round_idx, "device_id": r.device_id}


class _Terminal(ClientState[Never]):
    __slots__ = ()

    @property
    def is_terminal(self) -> bool:
        return True

    def handle(self, message: Message) -> Transition:
        """A finished device ignores whatever arrives (a late relay, a
        duplicate); only a matching ServerAbort turns Completed into Aborted."""
        if not isinstance(message, Message):
            raise TypeError(f"expected a secagg Message, got {type(message).__name__}")
        return self, []

    def abort(self, reason: AbortReason = AbortReason.CANCELLED, detail: str = "") -> Transition:
        raise ProtocolMisuse("the round is already over for this device")


class ClientCompleted(_Terminal):
    """The device answered the unmasking request; its part is done."""

    stage = "completed"
    __slots__ = ()

    def handle(self, message: Message) -> Transition:
        if (
            isinstance(message, ServerAbort)
            and message.session_id == self.config.session_id
            and message.round_idx == self.round_idx
            and message.device_id == self.device_id
        ):
            r = self._round
            return ClientAborted(r, AbortReason.SERVER_ABORTED, f"server: {message.reason.value}", self.stage), []
        return super().handle(message)


class ClientAborted(_Terminal):
    """The device left the round: `reason` (typed), `detail` (text) and the
    `at_stage` it was in."""

    stage = "aborted"
    __slots__ = ("reason", "detail", "at_stage")

    def __init__(self, rnd: ClientRound, reason: AbortReason, detail: str, at_stage: str) -> None:
        super().__init__(rnd)
        self.reason = reason
        self.detail = detail
        self.at_stage = at_stage

    def __repr__(self) -> str:
        return f"ClientAborted(device={self.device_id}, reason={self.reason.name}, at={self.at_stage}: {self.detail})"


def check_ids(ids: object, num_clients: int, what: str, reason: AbortReason) -> tuple[int, ...]:
    """A tuple of distinct cohort ids, or Reject(reason)."""
    if not isinstance(ids, tuple | list):
        raise Reject(reason, f"{what} is not a list of ids")
    for i in ids:
        if not (isinstance(i, int) and 0 <= i < num_clients):
            raise Reject(reason, f"{what} lists an unknown id {i!r}")
    if len(set(ids)) != len(ids):
        raise Reject(reason, f"{what} lists an id twice")
    return tuple(ids)
