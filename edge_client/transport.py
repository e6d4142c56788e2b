"""gRPC transport of the edge client: channel, credentials, Enroll, the Session stream.

Credentials (the coordinator's `auth.mode`, docs/decisions.md D8):
- mTLS: `--tls-ca` (the federation CA, verifies the coordinator) plus
  `--tls-cert/--tls-key` (this client's certificate from `fedmask certs init`);
- token: `--token`, sent as call metadata `authorization: Bearer <token>` on
  every RPC (over TLS when `--tls-ca` is given, else plaintext: the
  coordinator only allows that on loopback);
- neither: a plaintext channel (coordinator auth mode `none`, loopback only).

Proof of possession (fedmask.v1.1): `enroll` asks for an EnrollChallenge
and signs it with each device's identity key; on the stream the Hello is
answered by a SessionChallenge, which the driver answers with one
signature per device (DeviceProofs), and then comes the Welcome.

The stream: `run_session` sends Hello, answers the challenge, waits for
Welcome, then runs three
loops until the stream ends: reading (each ServerMessage to the driver),
writing (the driver's outbox, in order, one write at a time as grpc.aio
requires) and heartbeats (every Welcome.heartbeat_interval).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edge_client.session import FatalSessionError, SessionDriver
from fedmask_proto.v1 import coordinator_service_pb2_grpc, enrollment_pb2, session_pb2
from secagg import identity
from wire.possession import MAX_CHALLENGE_BYTES, enrollment_payload

log = logging.getLogger("edge_client.transport")

AUTHORIZATION_KEY = "authorization"
BEARER_PREFIX = "Bearer "
MAX_MESSAGE_BYTES = 512 * 1024 * 1024
WELCOME_TIMEOUT_S = 30.0
ENROLL_TIMEOUT_S = 30.0
# status codes after which retrying cannot help
FATAL_CODES = frozenset({
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.UNIMPLEMENTED,
})


class TransportConfigError(ValueError):
    """Inconsistent or unreadable TLS / token settings (user-facing)."""


@dataclass(frozen=True)
class TransportConfig:
    #: HOST:PORT, or several comma-separated: the replicas of a coordinator
    #: tier (D90), tried in turn, one per connection attempt (`for_attempt`).
    target: str
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_server_name: str | None = None
    token: str | None = None

    def __post_init__(self) -> None:
        for target in self.targets:
            host, sep, port = target.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise TransportConfigError(f"--coordinator must be HOST:PORT[,HOST:PORT...], got {self.target!r}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise TransportConfigError("--tls-cert and --tls-key go together (mTLS)")
        if self.tls_cert is not None and self.tls_ca is None:
            raise TransportConfigError("mTLS needs --tls-ca too (the CA that signed the coordinator's certificate)")
        if self.token is not None and not self.token.strip():
            raise TransportConfigError("--token is empty")

    @property
    def targets(self) -> tuple[str, ...]:
        """The addresses of --coordinator, in the order given."""
        return tuple(t.strip() for t in self.target.split(","))

    def for_attempt(self, attempt: int) -> str:
        """The address to dial on connection attempt `attempt` (0, 1, ...):
        the list in turn, so a dead or standby replica costs one attempt.
        Client-side rotation rather than gRPC's own balancing: each device
        stream stays on one replica, and a plain list works with host names
        and TLS alike (a load balancer in front is the other way, D90)."""
        return self.targets[attempt % len(self.targets)]

    @property
    def mode(self) -> str:
        if self.tls_cert is not None:
            return "mtls"
        return ("tls+" if self.tls_ca else "") + ("token" if self.token else "none")

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ((AUTHORIZATION_KEY, BEARER_PREFIX + self.token),) if self.token else ()


def _read(path: Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise TransportConfigError(f"cannot read {what} {path}: {e.strerror}") from None


def make_channel(cfg: TransportConfig, attempt: int = 0) -> grpc.aio.Channel:
    """A channel to `cfg.for_attempt(attempt)`."""
    target = cfg.for_attempt(attempt)
    options: list[tuple[str, int | str]] = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 0),
        # reconnects are ours (with jitter); keep gRPC's own short
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 2_000),
    ]
    if cfg.tls_ca is None:
        return grpc.aio.insecure_channel(target, options=options)
    if cfg.tls_server_name:
        options.append(("grpc.ssl_target_name_override", cfg.tls_server_name))
    creds = grpc.ssl_channel_credentials(
        root_certificates=_read(cfg.tls_ca, "--tls-ca"),
        private_key=_read(cfg.tls_key, "--tls-key") if cfg.tls_key else None,
        certificate_chain=_read(cfg.tls_cert, "--tls-cert") if cfg.tls_cert else None,
    )
    return grpc.aio.secure_channel(target, creds, options=options)


def describe_rpc_error(e: grpc.aio.AioRpcError, cfg: TransportConfig) -> str:
    code = e.code()
    text = f"{code.name}: {e.details() or ''}".strip()
    if code == grpc.StatusCode.UNAUTHENTICATED:
        hint = "check --token" if cfg.mode.endswith("token") else "check --tls-cert/--tls-key or pass --token"
        return f"the coordinator refused our credentials ({text}); {hint}"
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"coordinator {cfg.target} unreachable ({e.details()})"
    return text


def signed_enroll_request(challenge: bytes, client_name: str,
                          devices: Sequence[tuple[str, Ed25519PrivateKey]]) -> enrollment_pb2.EnrollRequest:
    """The EnrollRequest for (local_id, identity key) pairs, each device's
    possession signature over `challenge` included (wire.possession)."""
    entries = []
    for lid, key in devices:
        pk = identity.public_bytes(key)
        entries.append(enrollment_pb2.DeviceEnrollment(
            local_id=lid, identity_public_key=pk,
            possession_signature=identity.sign(key, enrollment_payload(challenge, client_name, lid, pk)),
        ))
    return enrollment_pb2.EnrollRequest(client_name=client_name, devices=entries, challenge=challenge)


async def enroll(
    stub: coordinator_service_pb2_grpc.CoordinatorServiceAsyncStub,
    cfg: TransportConfig,
    *,
    client_name: str,
    devices: Sequence[tuple[str, Ed25519PrivateKey]],
) -> dict[str, int]:
    """Enroll (local_id, identity key) pairs, proving possession of each key
    over a fresh EnrollChallenge; returns local_id -> device_id."""
    issued = await stub.EnrollChallenge(enrollment_pb2.EnrollChallengeRequest(), metadata=cfg.metadata(),
                                     timeout=ENROLL_TIMEOUT_S)
    req = signed_enroll_request(bytes(issued.challenge)[:MAX_CHALLENGE_BYTES], client_name, devices)
    resp = await stub.Enroll(req, metadata=cfg.metadata(), timeout=ENROLL_TIMEOUT_S)
    if len(resp.devices) != len(devices):
        raise FatalSessionError(f"Enroll answered {len(resp.devices)} devices for {len(devices)} asked")
    out: dict[str, int] = {}
    for asked, got in zip(devices, resp.devices, strict=True):
        if got.local_id != asked[0] or got.device_id < 1:
            raise FatalSessionError(f"Enroll answered {got.local_id!r}/{got.device_id} for {asked[0]!r}")
        out[got.local_id] = int(got.device_id)
    return out


_SessionCall = grpc.aio.StreamStreamCall[session_pb2.ClientMessage, session_pb2.ServerMessage]


async def _next_message(call: _SessionCall) -> session_pb2.ServerMessage | None:
    """The stream's next ServerMessage; None once the server has closed it.
    (grpc.aio types read() as returning `object`: EOF or the message.)"""
    msg = await call.read()
    if msg is grpc.aio.EOF:
        return None
    if not isinstance(msg, session_pb2.ServerMessage):
        raise TypeError(f"the Session stream yielded {type(msg).__name__}, not a ServerMessage")
    return msg


async def _message_before_welcome(call: _SessionCall) -> session_pb2.ServerMessage | None:
    """The stream's next message, within WELCOME_TIMEOUT_S (ConnectionError
    otherwise). Not asyncio.wait_for: on 3.11 it can swallow a cancellation
    that races with the read completing, and the client would not stop."""
    read = asyncio.ensure_future(_next_message(call))
    done, _ = await asyncio.wait([read], timeout=WELCOME_TIMEOUT_S)
    if not done:
        read.cancel()
        raise ConnectionError(f"no Welcome within {WELCOME_TIMEOUT_S:.0f}s")
    return read.result()


async def run_session(
    stub: coordinator_service_pb2_grpc.CoordinatorServiceAsyncStub,
    cfg: TransportConfig,
    driver: SessionDriver,
    *,
    on_welcome: Callable[[], None] | None = None,
) -> None:
    """One Session stream, from Hello to its end. Returns when the server
    closes the stream (OK); raises AioRpcError on transport errors."""
    driver.new_session()
    call = stub.Session(metadata=cfg.metadata(), wait_for_ready=False)
    tasks: list[asyncio.Task[None]] = []
    try:
        await call.write(driver.hello_message())
        first = await _message_before_welcome(call)
        if first is not None and first.WhichOneof("message") == "challenge":
            await driver.handle(first)  # queues the DeviceProofs
            await call.write(driver.outbox.get_nowait())
            first = await _message_before_welcome(call)
        if first is None:
            await call.wait_for_connection()
            code = await call.code()
            if code != grpc.StatusCode.OK:
                raise grpc.aio.AioRpcError(code, await call.initial_metadata(), await call.trailing_metadata(),
                                           await call.details())
            raise ConnectionError("the coordinator closed the session before Welcome")
        if first.WhichOneof("message") != "welcome":
            raise FatalSessionError(f"the coordinator's first message is {first.WhichOneof('message')}, not welcome")
        await driver.handle(first)
        if on_welcome is not None:
            on_welcome()

        async def writer() -> None:
            while True:
                m = await driver.outbox.get()
                await call.write(m)

        async def heartbeats() -> None:
            while True:
                await asyncio.sleep(driver.heartbeat_interval)
                driver.outbox.put_nowait(driver.heartbeat_message())

        tasks = [asyncio.create_task(writer()), asyncio.create_task(heartbeats())]
        while True:
            reader = asyncio.ensure_future(_next_message(call))
            done, _ = await asyncio.wait([reader, tasks[0]], return_when=asyncio.FIRST_COMPLETED)
            if tasks[0] in done and reader not in done:
                # the writer failed (the stream ended under it): the reader tells how
                await asyncio.wait([reader], timeout=5.0)
                if not reader.done():
                    reader.cancel()
                    raise ConnectionError("the session stream broke while writing")
            msg = reader.result()
            if msg is None:
                code = await call.code()
                if code != grpc.StatusCode.OK:
                    raise grpc.aio.AioRpcError(code, await call.initial_metadata(),
                                               await call.trailing_metadata(), await call.details())
                log.info("the coordinator closed the session")
                return
            await driver.handle(msg)
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except BaseException:  # noqa: BLE001 - cancelled or already failed
                pass
        driver.on_disconnect()
        call.cancel()


def session_message_kinds() -> list[str]:
    """Every ClientMessage case (for tests and docs)."""
    return [f.name for f in session_pb2.ClientMessage.DESCRIPTOR.oneofs_by_name["message"].fields]
