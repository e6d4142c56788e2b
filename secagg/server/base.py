"""What every server state shares, and the two terminal states.

A collecting server state takes `handle(sender, message)` for each device
message of its stage and returns `(self, [])`; `close()` (the stage's
deadline passed, or `pending` is empty) returns `(next_state, messages)`,
each message addressed by its `device_id`. A state that has been closed is
spent (using it again raises ProtocolMisuse).

Errors, by who is at fault:
- the caller (not a Message, a sender outside the cohort, a spent state):
  TypeError / ProtocolMisuse are raised;
- one device (another session or round, a spoofed sender id, an unexpected
  or malformed message, a bad signature): that device is *dropped*: recorded
  in `record.dropped` with a DropReason, never asked again, and the round goes
  on without it as long as the thresholds hold. A message from a device that
  already answered this stage, or is not part of it, is ignored and recorded
  in `record.rejections` (its first answer stands: a counted masked input
  cannot be taken back);
- too few live devices: `ServerAborted(reason)`, and a ServerAbort message to
  every device of the stage not dropped for cause. A device left out because
  too few of its neighbours are left (`prune`) gets a ServerAbort too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, NamedTuple, Never, TypeVar

import numpy as np

from secagg.config import SecAggConfig
from secagg.errors import AbortReason, DropReason, MalformedMessage, ProtocolMisuse
from secagg.graph import CommunicationGraph
from secagg.messages import AdvertiseKeys, ClientAbort, Message, ServerAbort

Transition = tuple["ServerState[Any]", list[Message]]

# The message type a stage accepts (Never for the terminal states).
M = TypeVar("M", bound=Message)


class Drop(Exception):
    """Raised inside `_accept` to drop the sender (never escapes)."""

    def __init__(self, reason: DropReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Rejection:
    """One message the server did not accept: who, at which stage, why."""

    device_id: int
    stage: str
    reason: DropReason | str
    detail: str


@dataclass(slots=True, eq=False)
class ServerRound:
    """The server's bookkeeping for one round, handed from state to state."""

    config: SecAggConfig
    round_idx: int
    graph: CommunicationGraph
    identity_keys: Mapping[int, bytes] | None
    advertised: dict[int, AdvertiseKeys] = field(default_factory=dict)
    u1: frozenset[int] = frozenset()  # got the KeyList
    sealed: dict[int, dict[int, bytes]] = field(default_factory=dict)  # sender -> receiver -> blob
    u2: frozenset[int] = frozenset()  # got the ShareRelay
    relayed: dict[int, frozenset[int]] = field(default_factory=dict)  # v -> senders relayed to v
    accumulator: np.ndarray | None = None  # sum of counted masked inputs (mod 2^32)
    u3: frozenset[int] = frozenset()  # masked input counted
    undecryptable: dict[int, frozenset[int]] = field(default_factory=dict)
    needs_s: frozenset[int] = frozenset()  # dropped after sharing, masked with by someone in U3
    signatures: dict[int, bytes] = field(default_factory=dict)  # active mode, U4
    requests: dict[int, tuple[frozenset[int], frozenset[int]]] = field(default_factory=dict)
    u5: frozenset[int] = frozenset()  # answered the unmasking request
    dropped: dict[int, tuple[str, DropReason]] = field(default_factory=dict)
    rejections: list[Rejection] = field(default_factory=list)
    survivors: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # removable noise: owner -> k -> the rebuilt seed of a component the sum must lose
    removed_seeds: dict[int, dict[int, bytes]] = field(default_factory=dict)

    def identity_key(self, device: int) -> bytes | None:
        """`device`'s identity public key (None if unknown); active mode only."""
        if self.identity_keys is None:
            raise ProtocolMisuse("identity keys are needed in active-adversary mode")
        return self.identity_keys.get(device)

    def sum_so_far(self) -> np.ndarray:
        """The accumulator, set from MaskedInputCollection until the end."""
        if self.accumulator is None:
            raise ProtocolMisuse("no masked input has been collected in this round")
        return self.accumulator

    def holders(self, owner: int, among: Iterable[int]) -> list[int]:
        """Devices in `among` that hold a usable share of `owner`'s secrets:
        the owner itself and the peers its sealed shares reached and opened."""
        out = []
        for v in among:
            if v == owner or (owner in self.relayed.get(v, ()) and owner not in self.undecryptable.get(v, ())):
                out.append(v)
        return out


class PruneRule(NamedTuple):
    """How a pruning stage reports its losses (`ServerState._prune_answered`)."""

    #: Why a pruned device is dropped (NEIGHBOURHOOD_TOO_SMALL's detail).
    detail: str
    #: The round's abort reason when fewer than t devices are left.
    too_few: AbortReason
    #: What the survivors did, for the abort's detail ("<n> devices <counted>, t=<t>").
    counted: str


@dataclass(frozen=True, slots=True)
class Pruned:
    """A pruning stage's close so far (`ServerState._prune_answered`)."""

    survivors: frozenset[int]
    #: The round's end when fewer than t devices survived; None otherwise.
    aborted: Transition | None
    #: ServerAborts for the pruned devices (empty when the round ended).
    notices: list[Message]


class ServerState(Generic[M]):
    """Base of the server states; see the module doc for the contract."""

    #: The Stage this state collects (a plain str on the terminal states).
    stage: ClassVar[str] = ""
    # The message class of the stage (== M); None for the terminal states.
    expects: type[M] | None = None

    __slots__ = ("_round", "_spent", "_expected", "_answered")

    def __init__(self, rnd: ServerRound, expected: Iterable[int]) -> None:
        self._round = rnd
        self._spent = False
        self._expected = frozenset(expected)
        self._answered: set[int] = set()

    @property
    def record(self) -> ServerRound:
        """The round's bookkeeping so far (read it, do not change it)."""
        return self._round

    @property
    def config(self) -> SecAggConfig:
        return self._round.config

    @property
    def round_idx(self) -> int:
        return self._round.round_idx

    @property
    def is_terminal(self) -> bool:
        return False

    @property
    def pending(self) -> frozenset[int]:
        """Devices this stage still waits for; close() early when empty."""
        return self._expected - self._answered - self._round.dropped.keys()

    def _check_usable(self) -> None:
        if self._spent:
            raise ProtocolMisuse(f"{type(self).__name__} was already closed; continue with the state it returned")

    def handle(self, sender: int, message: Message) -> Transition:
        """Take one message from device `sender` (the transport-authenticated id)."""
        self._check_usable()
        if not isinstance(message, Message):
            raise TypeError(f"expected a secagg Message, got {type(message).__name__}")
        r = self._round
        if not (isinstance(sender, int) and 0 <= sender < r.config.num_clients):
            raise ProtocolMisuse(f"sender {sender!r} is not a cohort id")
        if sender in r.dropped:
            return self._ignore(sender, "already dropped")
        if sender not in self._expected:
            return self._ignore(sender, f"not taking part in {self.stage}")
        if isinstance(message, ClientAbort):
            r.dropped[sender] = (self.stage, DropReason.CLIENT_ABORTED)
            return self, []
        if sender in self._answered:
            return self._ignore(sender, f"second {type(message).__name__} in {self.stage}", DropReason.DUPLICATE_MESSAGE)
        try:
            if message.session_id != r.config.session_id or message.round_idx != r.round_idx:
                raise Drop(DropReason.WRONG_SESSION_OR_ROUND, "message from another session or round")
            if message.device_id != sender:
                raise Drop(DropReason.SPOOFED_SENDER, f"message claims device {message.device_id!r}")
            if self.expects is None or not isinstance(message, self.expects):
                raise Drop(DropReason.UNEXPECTED_MESSAGE, f"{type(message).__name__} during {self.stage}")
            self._accept(sender, message)
        except Drop as d:
            self._drop(sender, d.reason, d.detail)
        except MalformedMessage as exc:
            self._drop(sender, DropReason.MALFORMED_MESSAGE, str(exc))
        else:
            self._answered.add(sender)
        return self, []

    def _accept(self, sender: int, message: M) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> Transition:
        """End the stage: compute who goes on, and the messages to send."""
        self._check_usable()
        self._spent = True
        return self._close()

    def _close(self) -> Transition:  # pragma: no cover - abstract
        raise NotImplementedError

    def abort(self, reason: AbortReason = AbortReason.CANCELLED, detail: str = "cancelled by the server") -> Transition:
        """Abort the round (e.g. the coordinator shuts down)."""
        self._check_usable()
        self._spent = True
        return self._abort(reason, detail)

    # -- helpers for subclasses

    def _ignore(self, sender: int, detail: str, reason: DropReason | str = "ignored") -> Transition:
        self._round.rejections.append(Rejection(sender, self.stage, reason, detail))
        return self, []

    def _drop(self, device: int, reason: DropReason, detail: str) -> None:
        r = self._round
        r.dropped[device] = (self.stage, reason)
        r.rejections.append(Rejection(device, self.stage, reason, detail))

    def _live(self, ids: Iterable[int]) -> frozenset[int]:
        return frozenset(i for i in ids if i not in self._round.dropped)

    def _prune_answered(self, rule: PruneRule) -> Pruned:
        """Close a stage whose survivors must keep >= t of each other in their
        closures: the devices that answered and are not dropped, pruned (see
        `prune`); records them as this stage's survivors and drops the rest
        for NEIGHBOURHOOD_TOO_SMALL (`rule.detail`). Fewer than t survivors
        end the round with `rule.too_few` ("<n> devices <rule.counted>,
        t=<t>"); otherwise the pruned devices get a ServerAbort with the same
        reason."""
        detail, too_few, counted = rule
        r = self._round
        t = r.config.threshold
        accepted = self._live(self._answered)
        survivors = prune(r.graph, accepted, t)
        pruned = sorted(accepted - survivors)
        for v in pruned:
            self._drop(v, DropReason.NEIGHBOURHOOD_TOO_SMALL, detail)
        r.survivors[self.stage] = tuple(sorted(survivors))
        if len(survivors) < t:
            return Pruned(survivors, self._abort(too_few, f"{len(survivors)} devices {counted}, t={t}"), [])
        return Pruned(survivors, None, self._notices(pruned, too_few))

    def _abort(self, reason: AbortReason, detail: str) -> Transition:
        """End the round; tell every device of this stage not dropped for cause."""
        r = self._round
        notify = [
            v for v in sorted(self._expected) if r.dropped.get(v, (None, None))[1] not in _FOR_CAUSE
        ]
        return ServerAborted(r, reason, detail, self.stage), self._notices(notify, reason)

    def _notices(self, devices: Iterable[int], reason: AbortReason) -> list[Message]:
        r = self._round
        return [
            ServerAbort(session_id=r.config.session_id, round_idx=r.round_idx, device_id=v, reason=reason)
            for v in devices
        ]

    def _header(self, device_id: int) -> dict[str, Any]:
        r = self._round
        return {"session_id": r.config.session_id, "round_idx": r.round_idx, "device_id": device_id}


# Drops for misbehaviour or the device's own abort: no notice is sent to them.
_FOR_CAUSE = frozenset(DropReason) - {DropReason.NEIGHBOURHOOD_TOO_SMALL, DropReason.TOO_FEW_SIGNERS_NEARBY}


class PruningState(ServerState[M]):
    """A stage closed by pruning: `_close` keeps the devices that answered and
    still reach t of each other (`_prune_answered` with the stage's `rule`),
    hands them to `_record` (U1 or U2; called also when the round ends there)
    and, with at least t left, to `_advance`, which returns the next state and
    its messages (the pruned devices' ServerAborts come first)."""

    rule: ClassVar[PruneRule]
    __slots__ = ()

    def _close(self) -> Transition:
        closed = self._prune_answered(self.rule)
        self._record(closed.survivors)
        if closed.aborted is not None:
            return closed.aborted
        return self._advance(closed.survivors, closed.notices)

    def _record(self, survivors: frozenset[int]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _advance(self, survivors: frozenset[int], notices: list[Message]) -> Transition:  # pragma: no cover - abstract
        raise NotImplementedError


class _Terminal(ServerState[Never]):
    __slots__ = ()

    def __init__(self, rnd: ServerRound) -> None:
        super().__init__(rnd, ())
        self._spent = True

    @property
    def is_terminal(self) -> bool:
        return True

    def handle(self, sender: int, message: Message) -> Transition:
        """Late messages after the end are ignored (and recorded)."""
        if not isinstance(message, Message):
            raise TypeError(f"expected a secagg Message, got {type(message).__name__}")
        return self._ignore(sender, "round is over")

    def close(self) -> Transition:
        raise ProtocolMisuse("the round is over")

    def abort(self, reason: AbortReason = AbortReason.CANCELLED, detail: str = "") -> Transition:
        raise ProtocolMisuse("the round is over")


class ServerCompleted(_Terminal):
    """The round's result: the exact sum (mod 2^32) of the encoded inputs of
    the `counted` devices, and its decoding. With removable noise,
    `removed_seeds` (owner -> k -> 32-byte seed): every counted device's
    components k in `config.removed_components(len(counted))`, rebuilt from
    the shares, for the caller to regenerate and subtract (this package
    knows nothing of the noise they seed)."""

    stage = "completed"
    __slots__ = ("encoded_sum", "counted", "removed_seeds")

    def __init__(self, rnd: ServerRound, encoded_sum: np.ndarray, counted: tuple[int, ...]) -> None:
        super().__init__(rnd)
        self.encoded_sum = encoded_sum
        self.counted = counted
        self.removed_seeds: Mapping[int, Mapping[int, bytes]] = rnd.removed_seeds

    def decoded_sum(self) -> np.ndarray:
        return self.config.encoding.decode_sum(self.encoded_sum, len(self.counted))

    def decoded_mean(self) -> np.ndarray:
        return self.config.encoding.decode_mean(self.encoded_sum, len(self.counted))


class ServerAborted(_Terminal):
    """The round failed: `reason` (typed), `detail`, and the `at_stage`."""

    stage = "aborted"
    __slots__ = ("reason", "detail", "at_stage")

    def __init__(self, rnd: ServerRound, reason: AbortReason, detail: str, at_stage: str) -> None:
        super().__init__(rnd)
        self.reason = reason
        self.detail = detail
        self.at_stage = at_stage

    def __repr__(self) -> str:
        return f"ServerAborted(reason={self.reason.name}, at={self.at_stage}: {self.detail})"


def prune(graph: CommunicationGraph, candidates: Iterable[int], threshold: int) -> frozenset[int]:
    """The largest subset S of `candidates` in which every v has at least
    `threshold` members of its closure N[v] in S (repeatedly drop devices
    whose neighbourhood is too thin: their secrets could not be rebuilt)."""
    alive = set(candidates)
    if graph.is_complete:
        return frozenset(alive) if len(alive) >= threshold else frozenset()
    queue = list(alive)
    while queue:
        v = queue.pop()
        if v in alive and len(graph.closure(v) & alive) < threshold:
            alive.discard(v)
            queue.extend(graph.neighbors(v) & alive)
    return frozenset(alive)
