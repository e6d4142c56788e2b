"""The in-process SecAgg(+) round: n simulated devices and the server in one process.

Used by the training engine (`fedmask simulate --secagg`), the platform-level
simulation, `fedmask bench` and the demo; the tests' step-by-step harness is
`secagg.testing.StepHarness`.

The driver `run_round` plays one whole round among n simulated devices in
this process: every device runs its own real client states (own keys, own
masks, own share decryption) and the server runs the real server states;
every message goes through its wire encoding (`wire=True`) exactly as a
transport would carry it. Nothing is computed once on behalf of two parties.

Stable signature:

    run_round(inputs, *, config, dropouts=None, round_idx=0, seed=0,
              wire=True, intercept=None, stochastic_rounding=True,
              clock=time.thread_time, rounding_keys=None) -> RoundOutcome

- inputs: float array (n, L), n = config.num_clients, L = config.vector_length,
  encoded by each device with the round's fixed-point encoding; or uint32
  (n, L): the devices' inputs already encoded as residues of Z_{2^w}
  (w = config.encoding.modulus_bits, every word < 2^w), e.g. the discrete
  Gaussian mechanism's (dpmech, D88), which decodes the sum itself. With
  residues the outcome has no decoded `sum` / `mean`, and `exact` means the
  unmasked sum equals the counted residues' sum mod 2^w, bit for bit.
- dropouts: DropoutPlan: which devices go silent at which stage.
- seed: makes the run reproducible (per-device random bytes, rounding, and
  identity keys in active mode all derive from it). These simulated devices
  use DeterministicRandom; real devices use os.urandom.
- wire: serialize and parse every message (realistic sizes and costs);
  False hands the objects over directly (a little faster).
- intercept(sender, receiver, message) -> message | None: a man in the middle
  for tests (SERVER = -1 stands for the server); return a replacement to
  deliver, or None to lose the message.
- rounding_keys: device i rounds with np.random.default_rng(rounding_keys[i])
  (default: (seed, i)). A round in groups (`secagg.grouped_round`) passes
  (the round's seed, the device's position in the cohort), so that a
  device's encoding is the one it would have in one round of the whole
  cohort.
- client_cpu_ms[i] covers device i's encoding, its handlers and the encoding
  and decoding of its messages; server_cpu_ms[stage] likewise for the server.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secagg import identity
from secagg.client import ClientAborted, ClientAdvertiseKeys, ClientState
from secagg.config import SecAggConfig
from secagg.errors import AbortReason, DropReason
from secagg.messages import (
    ConsistencyRequest,
    KeyList,
    MaskedInput,
    MaskingRequest,
    Message,
    ShareKeys,
    ShareRelay,
    UnmaskingRequest,
    decode_message,
)
from secagg.keys import SEED_BYTES
from secagg.randomness import DeterministicRandom
from secagg.server import ServerAborted, ServerAdvertiseKeys, ServerCompleted, ServerState
from secagg.stages import STAGES, Stage

SERVER = -1
FIXED_SESSION_ID = b"fedmask-test-session-0001"

# The stages at which a device can go silent, in protocol order. A device
# listed at stage S did everything before S and never sends its S message.
DROPOUT_STAGES: tuple[str, ...] = tuple(STAGES)

# The server message that asks a device for its stage-S message.
_TRIGGER = {
    KeyList: Stage.SHARE_KEYS,
    ShareRelay: Stage.SHARE_CHECK,
    MaskingRequest: Stage.MASKED_INPUT,
    ConsistencyRequest: Stage.CONSISTENCY_CHECK,
    UnmaskingRequest: Stage.UNMASKING,
}

Intercept = Callable[[int, int, Message], Message | None]


RoundingKeys = Sequence[tuple[int, int]]


def _rounding_rng(
    seed: int, i: int, rounding_keys: RoundingKeys | None, stochastic: bool
) -> np.random.Generator | None:
    """The generator device i rounds its encoding with (None: round half up)."""
    if not stochastic:
        return None
    return np.random.default_rng((seed, i) if rounding_keys is None else rounding_keys[i])


@dataclass(frozen=True)
class DropoutPlan:
    """Which devices go silent at which stage (see DROPOUT_STAGES)."""

    advertise_keys: frozenset[int] = frozenset()
    share_keys: frozenset[int] = frozenset()
    share_check: frozenset[int] = frozenset()
    masked_input: frozenset[int] = frozenset()
    consistency_check: frozenset[int] = frozenset()
    unmasking: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        seen: set[int] = set()
        for stage in DROPOUT_STAGES:
            ids = frozenset(getattr(self, stage))
            object.__setattr__(self, stage, ids)
            if ids & seen:
                raise ValueError(f"devices {sorted(ids & seen)} drop at two stages")
            seen |= ids

    @classmethod
    def at(cls, stage: str, devices: Iterable[int]) -> DropoutPlan:
        """All `devices` go silent at `stage` (hyphens allowed: 'masked-input')."""
        return cls(**{Stage.parse(stage).value: frozenset(devices)})

    @classmethod
    def random(cls, num_clients: int, fraction: float, stage: str, seed: int = 0) -> DropoutPlan:
        """round(fraction * n) devices, drawn with `seed`, go silent at `stage`."""
        if stage in ("none", None) or fraction <= 0:
            return cls()
        count = round(fraction * num_clients)
        chosen = np.random.default_rng(seed).choice(num_clients, size=count, replace=False)
        return cls.at(stage, (int(i) for i in chosen))

    def stage_of(self, device: int) -> str | None:
        for stage in DROPOUT_STAGES:
            if device in getattr(self, stage):
                return stage
        return None

    def as_dict(self) -> dict[str, list[int]]:
        return {s: sorted(getattr(self, s)) for s in DROPOUT_STAGES if getattr(self, s)}


@dataclass
class RoundOutcome:
    """What one simulated round produced. Times are CPU milliseconds
    (time.thread_time), attributed to the device or server doing the work,
    including encoding of that party's messages."""

    ok: bool
    config: SecAggConfig
    abort_reason: AbortReason | None = None
    abort_detail: str = ""
    abort_stage: str | None = None
    encoded_sum: np.ndarray | None = None  # uint32, exact sum of the counted encoded inputs (mod 2^w for residues)
    residues: bool = False  # the inputs were residues of Z_{2^w} (no fixed-point decoding here)
    sum: np.ndarray | None = None  # decoded float64 sum
    mean: np.ndarray | None = None  # decoded float64 mean
    counted: tuple[int, ...] = ()
    expected_encoded_sum: np.ndarray | None = None  # plaintext sum of counted inputs (check)
    # removable noise: the seeds each device was given (components 1..m), and those the server rebuilt
    component_seeds: dict[int, tuple[bytes, ...]] = field(default_factory=dict)
    removed_seeds: dict[int, dict[int, bytes]] = field(default_factory=dict)
    exact: bool | None = None  # encoded_sum == expected_encoded_sum, bit for bit
    survivors: dict[str, tuple[int, ...]] = field(default_factory=dict)
    server_dropped: dict[int, tuple[str, DropReason]] = field(default_factory=dict)
    client_aborts: dict[int, ClientAborted] = field(default_factory=dict)
    client_states: dict[int, str] = field(default_factory=dict)  # final state class per device
    client_cpu_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (n,), all of a device's stages
    server_cpu_ms: dict[str, float] = field(default_factory=dict)  # per server stage
    message_bytes: dict[str, dict[str, int]] = field(default_factory=dict)  # stage -> up/down totals
    masked_input_bytes: int | None = None  # one device's MaskedInput on the wire
    share_ciphertext_bytes: int | None = None  # one sealed share pair (nonce + ciphertext + tag)
    wall_s: float = 0.0
    server_state: ServerState[Any] | None = None


def encode_inputs(
    inputs: np.ndarray, *, config: SecAggConfig, seed: int = 0, stochastic_rounding: bool = True,
    rounding_keys: RoundingKeys | None = None,
) -> np.ndarray:
    """The (n, L) uint32 encodings `run_round` gives the devices (same seed,
    same result): device i rounds with np.random.default_rng((seed, i)), or
    with rounding_keys[i]."""
    inputs = _check_inputs(inputs, config)
    _check_rounding_keys(rounding_keys, config.num_clients)
    out = np.empty(inputs.shape, dtype=np.uint32)
    for i in range(inputs.shape[0]):
        out[i] = config.encoding.encode(inputs[i], _rounding_rng(seed, i, rounding_keys, stochastic_rounding))
    return out


def _check_rounding_keys(rounding_keys: RoundingKeys | None, n: int) -> None:
    if rounding_keys is not None and len(rounding_keys) != n:
        raise ValueError(f"rounding_keys lists {len(rounding_keys)} keys for {n} devices")


def identity_keys(num_clients: int, seed: int = 0) -> tuple[list[Ed25519PrivateKey], dict[int, bytes]]:
    """Fixed Ed25519 identity keys for devices 0..n-1: (private keys, id -> public)."""
    privs = [identity.generate_identity(DeterministicRandom(seed, f"identity-{i}")) for i in range(num_clients)]
    return privs, {i: identity.public_bytes(k) for i, k in enumerate(privs)}


def _identities(
    num_clients: int, seed: int, active: bool
) -> tuple[list[Ed25519PrivateKey | None], dict[int, bytes] | None]:
    """identity_keys() in active mode, else no keys: ([None] * n, None)."""
    if not active:
        return [None] * num_clients, None
    privs, pubs = identity_keys(num_clients, seed)
    return list(privs), pubs


def _check_inputs(inputs: np.ndarray, config: SecAggConfig) -> np.ndarray:
    inputs = np.asarray(inputs)
    if inputs.shape != (config.num_clients, config.vector_length):
        raise ValueError(f"inputs must have shape ({config.num_clients}, {config.vector_length}), got {inputs.shape}")
    if inputs.dtype == np.uint32:
        w = config.encoding.modulus_bits
        if inputs.size and int(inputs.max()) >> w:
            raise ValueError(f"encoded inputs must be residues below 2^{w}")
        return inputs
    if not np.issubdtype(inputs.dtype, np.floating):
        raise TypeError(f"inputs must be floats, or uint32 residues already encoded, got {inputs.dtype}")
    return inputs


def run_round(
    inputs: np.ndarray,
    *,
    config: SecAggConfig,
    dropouts: DropoutPlan | None = None,
    round_idx: int = 0,
    seed: int = 0,
    wire: bool = True,
    intercept: Intercept | None = None,
    stochastic_rounding: bool = True,
    clock: Callable[[], float] = time.thread_time,
    rounding_keys: RoundingKeys | None = None,
) -> RoundOutcome:
    """Run one secure-aggregation round among config.num_clients simulated
    devices (see the module doc). Never raises for dropouts or peer
    misbehaviour: those show in the outcome. `clock` (seconds) times each
    party's work; the default counts this thread's CPU only."""
    wall0 = time.perf_counter()
    inputs = _check_inputs(inputs, config)
    _check_rounding_keys(rounding_keys, config.num_clients)
    plan = dropouts or DropoutPlan()
    n = config.num_clients
    for stage in DROPOUT_STAGES:
        if any(not 0 <= d < n for d in getattr(plan, stage)):
            raise ValueError(f"dropout plan lists ids outside 0..{n - 1}")
    rnd = _Round(config, plan, wire=wire, intercept=intercept, clock=clock)
    encoded = rnd.encode(inputs, seed=seed, stochastic_rounding=stochastic_rounding, rounding_keys=rounding_keys)
    starting = rnd.start(encoded, round_idx=round_idx, seed=seed)
    rnd.advertise(starting)
    while not rnd.server.is_terminal:
        rnd.close_stage()
    out = rnd.outcome(encoded, residues=inputs.dtype == np.uint32)
    out.wall_s = time.perf_counter() - wall0
    return out


class _Round:
    """The parties of one `run_round` and what they have done so far: their
    states, the bytes they sent and the time each spent. Every party's work
    is timed with `clock` and charged to it: a device's to `cpu[device]`,
    the server's to `server_cpu[stage]`, the stage it was closing or
    collecting."""

    def __init__(
        self, config: SecAggConfig, plan: DropoutPlan, *, wire: bool, intercept: Intercept | None,
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.plan = plan
        self.wire = wire
        self.intercept = intercept
        self.clock = clock
        self.cpu = np.zeros(config.num_clients)
        self.server_cpu: dict[str, float] = {}
        self.sizes: dict[str, dict[str, int]] = {}  # stage -> "up" / "down" byte totals
        self.first_sizes: dict[str, int] = {}  # "masked_input", "share": the first one sent
        self.silent: set[int] = set()  # devices that dropped out
        self.clients: dict[int, ClientState[Any]] = {}
        self.server: ServerState[Any]
        self.component_seeds: dict[int, tuple[bytes, ...]] = {}

    def _charge(self, party: int, stage: str, seconds: float) -> None:
        """Add `seconds` to device `party`, or to the server's `stage` when
        `party` is SERVER."""
        if party == SERVER:
            self.server_cpu[stage] = self.server_cpu.get(stage, 0.0) + seconds
        else:
            self.cpu[party] += seconds

    def encode(
        self, inputs: np.ndarray, *, seed: int, stochastic_rounding: bool, rounding_keys: RoundingKeys | None
    ) -> np.ndarray:
        """Each device encodes its input, as `encode_inputs` does (residues are taken as they are)."""
        if inputs.dtype == np.uint32:
            return np.array(inputs, dtype=np.uint32)
        encoded = np.empty((self.config.num_clients, self.config.vector_length), dtype=np.uint32)
        for i in range(self.config.num_clients):
            t0 = self.clock()
            rng = _rounding_rng(seed, i, rounding_keys, stochastic_rounding)
            encoded[i] = self.config.encoding.encode(inputs[i], rng)
            self.cpu[i] += self.clock() - t0
        return encoded

    def start(self, encoded: np.ndarray, *, round_idx: int, seed: int) -> dict[int, ClientAdvertiseKeys]:
        """Every device's first state, and the server's; with identity keys
        in active mode."""
        config = self.config
        id_priv, id_pub = _identities(config.num_clients, seed, config.active_adversary)
        starting: dict[int, ClientAdvertiseKeys] = {}
        for i in range(config.num_clients):
            components = DeterministicRandom(seed, f"device-{i}-round-{round_idx}-component-seeds")
            self.component_seeds[i] = tuple(components(SEED_BYTES) for _ in range(config.removable_components))
            t0 = self.clock()
            starting[i] = ClientAdvertiseKeys(
                config,
                i,
                round_idx,
                encoded[i],
                rand=DeterministicRandom(seed, f"device-{i}-round-{round_idx}"),
                identity_key=id_priv[i],
                peer_identity_keys=id_pub,
                removable_seeds=self.component_seeds[i],
            )
            self.cpu[i] += self.clock() - t0
        t0 = self.clock()
        self.server = ServerAdvertiseKeys(config, round_idx, identity_keys=id_pub)
        self.server_cpu[self.server.stage] = self.clock() - t0
        self.clients = dict(starting)
        return starting

    def advertise(self, starting: dict[int, ClientAdvertiseKeys]) -> None:
        """Stage 0: every device that does not drop advertises its keys."""
        for i in range(self.config.num_clients):
            if i in self.plan.advertise_keys:
                self.silent.add(i)
                continue
            t0 = self.clock()
            self.clients[i], msgs = starting[i].start()
            self.cpu[i] += self.clock() - t0
            self._to_server(i, msgs)

    def close_stage(self) -> None:
        """The server closes its stage; each device it addresses that does
        not drop now handles its message, and its replies go to the server."""
        stage = self.server.stage
        t0 = self.clock()
        self.server, outbound = self.server.close()
        self._charge(SERVER, stage, self.clock() - t0)
        next_stage = self.server.stage
        for msg in outbound:
            v = msg.device_id
            if v in self.silent:
                continue
            trigger = _TRIGGER.get(type(msg))
            if trigger is not None and v in getattr(self.plan, trigger):
                self.silent.add(v)  # received the request, never answers
                continue
            replies = self._deliver(SERVER, v, msg, stage, bytes_stage=next_stage, direction="down")
            self._to_server(v, replies)

    def _to_server(self, i: int, msgs: list[Message]) -> None:
        stage = self.server.stage
        for msg in msgs:
            self._deliver(i, SERVER, msg, stage, bytes_stage=stage, direction="up")

    def _deliver(
        self, sender: int, receiver: int, sent: Message, stage: str, *, bytes_stage: str, direction: str
    ) -> list[Message]:
        """Carry `sent` (through the hook, then over the wire) and have the
        receiver handle it; returns the device's replies ([] when the
        receiver is the server or the hook withheld the message). The
        server's share of the work counts to `stage`, the bytes to
        `bytes_stage`'s `direction` total ("up" or "down")."""
        payload = self._transmit(sender, receiver, sent, stage, bytes_stage, direction)
        if payload is None:
            return []
        t0 = self.clock()
        delivered = decode_message(payload) if isinstance(payload, bytes) else payload
        replies: list[Message] = []
        if receiver == SERVER:
            self.server, _ = self.server.handle(sender, delivered)
        else:
            self.clients[receiver], replies = self.clients[receiver].handle(delivered)
        self._charge(receiver, stage, self.clock() - t0)
        return replies

    def _transmit(
        self, sender: int, receiver: int, sent: Message, stage: str, bytes_stage: str, direction: str
    ) -> Message | bytes | None:
        """Hook, then encoding (charged to the sender): the message or, over
        the wire, its bytes; None if the hook withheld it."""
        msg = sent
        if self.intercept is not None:
            hooked = self.intercept(sender, receiver, sent)
            if hooked is None:
                return None
            msg = hooked
        if not self.wire:
            return msg
        t0 = self.clock()
        data = msg.to_bytes()
        self._charge(sender, stage, self.clock() - t0)
        bucket = self.sizes.setdefault(bytes_stage, {"up": 0, "down": 0})
        bucket[direction] += len(data)
        if isinstance(msg, MaskedInput):
            self.first_sizes.setdefault("masked_input", len(data))
        if isinstance(msg, ShareKeys) and msg.shares:
            self.first_sizes.setdefault("share", len(msg.shares[0][1]))
        return data

    def outcome(self, encoded: np.ndarray, *, residues: bool = False) -> RoundOutcome:
        """What the round produced (its wall time is the caller's); with
        `residues`, the sum is checked mod 2^w and not decoded."""
        server = self.server
        rec = server.record
        out = RoundOutcome(
            ok=isinstance(server, ServerCompleted),
            config=self.config,
            survivors=dict(rec.survivors),
            server_dropped=dict(rec.dropped),
            client_aborts={i: s for i, s in self.clients.items() if isinstance(s, ClientAborted)},
            client_states={i: type(s).__name__ for i, s in self.clients.items()},
            client_cpu_ms=self.cpu * 1e3,
            server_cpu_ms={k: v * 1e3 for k, v in self.server_cpu.items()},
            message_bytes=self.sizes,
            masked_input_bytes=self.first_sizes.get("masked_input"),
            share_ciphertext_bytes=self.first_sizes.get("share"),
            server_state=server,
            residues=residues,
            component_seeds=dict(self.component_seeds),
        )
        if isinstance(server, ServerCompleted):
            out.encoded_sum = server.encoded_sum
            out.counted = server.counted
            out.removed_seeds = {u: dict(ks) for u, ks in server.removed_seeds.items()}
            expected = encoded[list(server.counted)].sum(axis=0, dtype=np.uint64)
            if residues:  # the sum of residues of Z_{2^w} wraps by design: compared, and kept, mod 2^w
                expected &= np.uint64((1 << self.config.encoding.modulus_bits) - 1)
                out.encoded_sum = self.config.encoding.reduce(server.encoded_sum)
                out.exact = bool(np.array_equal(expected, out.encoded_sum.astype(np.uint64)))
            else:
                out.sum = server.decoded_sum()
                out.mean = server.decoded_mean()
                out.exact = bool(np.array_equal(expected, server.encoded_sum.astype(np.uint64)))
            out.expected_encoded_sum = expected.astype(np.uint32)
        elif isinstance(server, ServerAborted):
            out.abort_reason = server.reason
            out.abort_detail = server.detail
            out.abort_stage = server.at_stage
        return out
