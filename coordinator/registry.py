"""Enrolment, sessions and the device registry of the coordinator.

`DeviceRegistry` owns who is enrolled (a cache of the store's device table)
and which open Session stream hosts which device:

    await registry.load()                          devices from the store
    registry.enroll_challenge()                    -> EnrollChallengeResponse
    await registry.enroll(request, client_id)      -> EnrollResponse (proofs checked)
    registry.check_hello(hello)                    version rule, before the challenge
    session = await registry.open(hello, nonce=, proofs=, ...)
                                                   Hello + proofs -> admitted, Welcome queued
    await registry.admit(session, announced, proofs)  CheckIn -> DeviceAdmission
    registry.close(session, why)                   the stream ended
    registry.owner(device_id) / available(model)   for the round loop and the relay
    registry.watch_streams(listener)               every change of a device's hosting stream
    registry.release_remote(ids, why=)             devices another replica took

Proof of possession (fedmask.v1.1, D32): an Enroll is accepted only with
every device's signature over a challenge this coordinator issued (a
replica of a tier: any replica of its tier, whose secret the Coordinator
gives `challenges` at start; `coordinator.possession`), and a stream admits a device only once it
signed the stream's nonce with the enrolled identity key; an unproven claim
is rejected NOT_PROVEN and changes nothing else. A device is hosted by at
most one stream: a newer stream that announces AND proves it displaces the
older one (which is ended once it hosts nothing). Devices
that leave (displaced, unannounced, stream closed) are reported through
`on_device_left(device_id, why)` so the running round counts them as
dropouts; any change of availability calls `on_changed()`.

Stream listeners (`watch_streams`, the replica's stream publisher) hear
every change of which stream hosts a device, as it happens:
`listener(device_id, sid, available)` says stream `sid` hosts the device,
available or not, and `listener(device_id, sid, None)` that stream `sid`
no longer hosts it (closed, displaced, revoked). A device that another
replica took (`release_remote`) is released here the way a local
displacement releases it.

Runs on the coordinator's event loop; store calls go to worker threads.
Raises `coordinator.errors` exceptions (InvalidArgument, PermissionDenied,
ProtocolViolation) for the servicer to map to status codes.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

import grpc
from google.protobuf import timestamp_pb2

from coordinator.errors import InvalidArgument, PermissionDenied, ProtocolViolation
from coordinator.limits import (
    MAX_ANNOUNCED_DEVICES,
    MAX_CLIENT_NAME_CHARS,
    MAX_ENROLL_DEVICES,
    MAX_LOCAL_ID_CHARS,
    Throttle,
)
from coordinator.logs import log_event
from coordinator.possession import EnrollChallenges, enrollment_refusal, proven_devices
from coordinator.store import DeviceRecord, DeviceStatus, EnrollmentConflictError, Store
from fedmask_proto.v1 import enrollment_pb2, session_pb2
from wire.lanes import LaneQueue
from wire.protocol import IDENTITY_KEY_BYTES, PROTOCOL_VERSION, version_refusal
from wire.possession import SESSION_NONCE_BYTES
from wire.round_task import seconds_to_duration

COORDINATOR_VERSION = "0.1.0"
#: ServerMessage kinds of a stream's urgent lane (ClientSession.outbox).
_URGENT = frozenset({"welcome", "device_request"})
DEFAULT_LOOKUP_INTERVAL_S = 1.0
DEFAULT_MAX_LOOKUPS = 256
#: A device's hosting changed: (device_id, the stream's sid, available; None: that stream no longer hosts it).
StreamListener = Callable[[int, int, bool | None], None]


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """Outbox sentinel: end the stream with `code` (OK = graceful)."""

    code: grpc.StatusCode
    detail: str = ""


@dataclass(eq=False)
class ClientSession:
    """One edge-client process's Session stream."""

    sid: int
    client_name: str
    client_id: str | None
    peer: str
    supported_models: frozenset[str]
    last_seen: float
    #: This stream's challenge nonce (SessionChallenge); proofs sign it.
    nonce: bytes = b""
    #: Devices that proved possession of their identity key on this stream.
    proven: set[int] = field(default_factory=set)
    devices: set[int] = field(default_factory=set)  # accepted, owned by this stream
    available: set[int] = field(default_factory=set)  # subset of devices, selectable now
    #: device requests (top-k) overtake a round's bulk messages, wire/lanes.py. The Welcome
    #: rides the urgent lane too: a request for a device may be queued as soon as `open`
    #: has bound it, and must never reach the client before the Welcome (which it refuses).
    outbox: asyncio.Queue[session_pb2.ServerMessage | StreamEnd] = field(default_factory=lambda: LaneQueue(
        lambda m: isinstance(m, session_pb2.ServerMessage) and m.WhichOneof("message") in _URGENT))
    closed: bool = False

    def send(self, message: session_pb2.ServerMessage) -> None:
        if not self.closed:
            self.outbox.put_nowait(message)

    def end(self, code: grpc.StatusCode, detail: str = "") -> None:
        if not self.closed:
            self.closed = True
            self.outbox.put_nowait(StreamEnd(code, detail))

    def supports(self, model_name: str) -> bool:
        return not self.supported_models or model_name in self.supported_models


def now_timestamp(wall: Callable[[], datetime]) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(wall())
    return ts


def check_enroll_request(request: enrollment_pb2.EnrollRequest) -> None:
    """Validate an EnrollRequest's meaning before anything is stored:
    1..MAX_ENROLL_DEVICES devices, local ids non-empty, bounded and unique,
    identity keys of the right length and unique. Raises InvalidArgument."""
    devices = request.devices
    if not devices:
        raise InvalidArgument("EnrollRequest lists no device")
    if len(devices) > MAX_ENROLL_DEVICES:
        raise InvalidArgument(f"EnrollRequest lists {len(devices)} devices (at most {MAX_ENROLL_DEVICES})")
    seen_ids: set[str] = set()
    seen_keys: set[bytes] = set()
    for i, d in enumerate(devices):
        if not d.local_id or len(d.local_id) > MAX_LOCAL_ID_CHARS:
            raise InvalidArgument(f"devices[{i}].local_id is empty or longer than {MAX_LOCAL_ID_CHARS}")
        if d.local_id in seen_ids:
            raise InvalidArgument(f"devices[{i}].local_id {d.local_id!r} appears twice")
        if len(d.identity_public_key) != IDENTITY_KEY_BYTES:
            raise InvalidArgument(f"devices[{i}].identity_public_key must be {IDENTITY_KEY_BYTES} bytes")
        if d.identity_public_key in seen_keys:
            raise InvalidArgument(f"devices[{i}].identity_public_key appears twice")
        seen_ids.add(d.local_id)
        seen_keys.add(bytes(d.identity_public_key))


class DeviceRegistry:
    """See the module doc."""

    def __init__(
        self,
        store: Store,
        *,
        heartbeat_interval: float,
        clock: Callable[[], float],
        wall_clock: Callable[[], datetime],
        on_device_left: Callable[[int, str], None],
        on_changed: Callable[[], None],
        lookup_interval_s: float = DEFAULT_LOOKUP_INTERVAL_S,
        max_lookups: int = DEFAULT_MAX_LOOKUPS,
        challenges: EnrollChallenges | None = None,
    ) -> None:
        """`lookup_interval_s` / `max_lookups`: announced ids missing from the
        cache are looked up in the store (`get_device`, one by one in a
        worker thread, at most `max_lookups` of them) at most once per
        `lookup_interval_s` seconds over all streams; ids not looked up are
        rejected as unknown (an honest client's next CheckIn asks again)."""
        if max_lookups < 1:
            raise ValueError("max_lookups must be >= 1")
        self._store = store
        self._heartbeat = heartbeat_interval
        self._clock = clock
        self._wall = wall_clock
        self._on_device_left = on_device_left
        self._on_changed = on_changed
        self.devices: dict[int, DeviceRecord] = {}
        self.sessions: dict[int, ClientSession] = {}
        self._owner: dict[int, ClientSession] = {}
        self._sid = itertools.count(1)
        #: store look-ups of unknown announced ids so far (tests, metrics)
        self.lookups = 0
        self._lookups = Throttle(lookup_interval_s, clock)
        self._max_lookups = max_lookups
        self.challenges = challenges or EnrollChallenges(clock=clock)
        self._stream_listeners: list[StreamListener] = []

    # ------------------------------------------------------------------ queries

    def owner(self, device_id: int) -> ClientSession | None:
        """The open stream hosting the device, if any."""
        return self._owner.get(device_id)

    async def enrolled(self, device_id: int) -> bool:
        """Whether `device_id` is enrolled: the cache, else the store (a
        device enrolled through another replica of an active tier, D109, is
        in the store before it is in this replica's cache)."""
        if device_id in self.devices:
            return True
        return await asyncio.to_thread(self._store.get_device, device_id) is not None

    def watch_streams(self, listener: StreamListener) -> None:
        """Call `listener` on every change of a device's hosting stream from
        now on (see the module doc); it runs on the event loop, inside the
        registry's change, and must not raise."""
        self._stream_listeners.append(listener)

    def _hosting(self, device_id: int, sid: int, available: bool | None) -> None:
        for listener in self._stream_listeners:
            listener(device_id, sid, available)

    def is_revoked(self, device_id: int) -> bool:
        rec = self.devices.get(device_id)
        return rec is not None and rec.status is not DeviceStatus.ACTIVE

    def available(self, model_name: str) -> Iterator[int]:
        """Devices selectable now for a round of `model_name`."""
        for s in self.sessions.values():
            if not s.closed and s.supports(model_name):
                yield from s.available

    # ------------------------------------------------------------------ enrolment

    async def load(self) -> None:
        for rec in await asyncio.to_thread(self._store.list_devices):
            self.devices[rec.id] = rec

    async def refresh_revocations(self) -> list[int]:
        """Read the revoked devices from the store and apply revocations an operator made in
        the store (`fedmask devices revoke`) while the coordinator runs: a
        revoked device leaves its stream's hosted set (so it is neither
        selected nor counted; a running round loses it as a dropout) and is
        refused at its next Hello or CheckIn. Returns the newly revoked ids."""
        revoked = {rec.id: rec for rec in
                   await asyncio.to_thread(self._store.list_devices, status=DeviceStatus.REVOKED)}
        # restored by an operator since: read those few back
        restored = [d for d, rec in self.devices.items() if rec.status is DeviceStatus.REVOKED and d not in revoked]
        if restored:
            for rec in await asyncio.to_thread(lambda: [r for d in restored if (r := self._store.get_device(d))]):
                self.devices[rec.id] = rec
        newly: list[int] = []
        for rec in revoked.values():
            old = self.devices.get(rec.id)
            self.devices[rec.id] = rec
            if old is None or old.status is DeviceStatus.ACTIVE:
                newly.append(rec.id)
                owner = self._owner.get(rec.id)
                if owner is not None:
                    self._release(owner, rec.id, "revoked by an operator")
        if newly:
            log_event("devices_revoked", devices=",".join(map(str, newly)))
            self._on_changed()
        return newly

    def enroll_challenge(self) -> enrollment_pb2.EnrollChallengeResponse:
        """A fresh enrolment challenge (valid `challenges.ttl_s`)."""
        return enrollment_pb2.EnrollChallengeResponse(
            challenge=self.challenges.issue(), valid_for=seconds_to_duration(self.challenges.ttl_s))

    async def enroll(self, request: enrollment_pb2.EnrollRequest, *, client_id: str | None) -> enrollment_pb2.EnrollResponse:
        """Enrol every device of the request or none. Before anything is
        stored: the request's shape, the challenge (ProtocolViolation when
        missing, foreign or expired) and every device's possession signature
        (PermissionDenied naming only the caller's own local id)."""
        check_enroll_request(request)
        refusal = self.challenges.refusal(bytes(request.challenge))
        if refusal is not None:
            raise ProtocolViolation(refusal)
        devices = request.devices
        bad = await asyncio.to_thread(enrollment_refusal, request)
        if bad is not None:
            raise PermissionDenied(f"device {devices[bad].local_id[:64]!r} did not prove possession of its identity key")

        def work() -> list[tuple[DeviceRecord, bool]]:
            # One store transaction for the whole request: all devices or none (D23).
            try:
                return self._store.enroll_devices(
                    [(bytes(d.identity_public_key), d.local_id) for d in devices], client_id=client_id
                )
            except EnrollmentConflictError as exc:  # say no more than the caller already knows
                shown = devices[exc.index].local_id[:64]
                what = {exc.REVOKED: "is revoked", exc.HANDLE_TAKEN: "is a user handle another device holds"}.get(
                    exc.reason, "is not yours to enrol")
                raise PermissionDenied(f"device {shown!r} {what}") from None

        results = await asyncio.to_thread(work)
        out = enrollment_pb2.EnrollResponse(protocol_version=PROTOCOL_VERSION, coordinator_version=COORDINATOR_VERSION)
        for d, (rec, new) in zip(devices, results, strict=True):
            self.devices[rec.id] = rec
            out.devices.add(local_id=d.local_id, device_id=rec.id, newly_enrolled=new)
        log_event("enrolled", client=request.client_name[:64], devices=len(devices),
                  new=sum(1 for _, n in results if n))
        return out

    # ------------------------------------------------------------------ sessions

    @staticmethod
    def check_hello(hello: session_pb2.Hello) -> None:
        """ProtocolViolation (FAILED_PRECONDITION) for a protocol version this
        coordinator does not serve, with a message that says to upgrade."""
        refusal = version_refusal(hello.protocol_version)
        if refusal is not None:
            raise ProtocolViolation(refusal)

    async def open(self, hello: session_pb2.Hello, *, nonce: bytes, proofs: Iterable[session_pb2.DeviceProof],
                   client_id: str | None, peer: str = "") -> ClientSession:
        """A new stream sent its Hello and, to the challenge `nonce`, its
        proofs: check the version, admit the proven devices (displacing
        older streams that hosted them) and queue the Welcome."""
        self.check_hello(hello)
        if len(nonce) != SESSION_NONCE_BYTES:
            raise ValueError(f"the session nonce must be {SESSION_NONCE_BYTES} bytes")
        session = ClientSession(
            sid=next(self._sid),
            client_name=hello.client_name[:MAX_CLIENT_NAME_CHARS],
            client_id=client_id,
            peer=peer,
            supported_models=frozenset(hello.supported_models),
            last_seen=self._clock(),
            nonce=nonce,
        )
        admission = await self.admit(session, hello.available_device_ids, proofs)
        self.sessions[session.sid] = session
        session.send(
            session_pb2.ServerMessage(
                welcome=session_pb2.Welcome(
                    protocol_version=PROTOCOL_VERSION,
                    coordinator_version=COORDINATOR_VERSION,
                    heartbeat_interval=seconds_to_duration(self._heartbeat),
                    admission=admission,
                    server_time=now_timestamp(self._wall),
                )
            )
        )
        log_event("session_opened", session=session.sid, client=session.client_name, peer=peer,
                  accepted=len(admission.accepted_device_ids), rejected=len(admission.rejected))
        self._on_changed()
        return session

    async def admit(self, session: ClientSession, announced: Iterable[int],
                    proofs: Iterable[session_pb2.DeviceProof] = ()) -> session_pb2.DeviceAdmission:
        """The stream announces the devices it hosts and that are available
        now (Hello or CheckIn), with proofs for those not yet proven on it:
        the accepted list replaces its available set. An announced device
        without a valid proof on this stream is rejected NOT_PROVEN (before
        ownership and revocation are looked at, so neither is revealed) and
        neither displaces nor disturbs the stream that hosts it."""
        ids = list(announced)
        if len(ids) > MAX_ANNOUNCED_DEVICES:
            raise ProtocolViolation(f"{len(ids)} devices announced (at most {MAX_ANNOUNCED_DEVICES})")
        if len(set(ids)) != len(ids):
            raise ProtocolViolation("a device is announced twice")
        unknown = [d for d in ids if d not in self.devices]  # enrolled since start by another path, or never
        if unknown:
            await self._look_up(unknown)
        to_prove = [d for d in ids if d not in session.proven and d in self.devices]
        if to_prove:
            keys = {d: self.devices[d].identity_public_key for d in to_prove}
            proofs = list(proofs)
            session.proven |= await asyncio.to_thread(proven_devices, session.nonce, proofs, to_prove, keys)
        admission = session_pb2.DeviceAdmission()
        accepted: list[int] = []
        R = session_pb2
        for d in ids:
            rec = self.devices.get(d)
            if rec is None:
                admission.rejected.add(device_id=d, reason=R.DEVICE_REJECTION_REASON_UNKNOWN_DEVICE)
            elif d not in session.proven:
                admission.rejected.add(device_id=d, reason=R.DEVICE_REJECTION_REASON_NOT_PROVEN)
            elif rec.client_id and session.client_id and rec.client_id != session.client_id:
                # before REVOKED: another client's device's status is not this client's business
                admission.rejected.add(device_id=d, reason=R.DEVICE_REJECTION_REASON_NOT_OWNED)
            elif rec.status is not DeviceStatus.ACTIVE:
                admission.rejected.add(device_id=d, reason=R.DEVICE_REJECTION_REASON_REVOKED)
            else:
                accepted.append(d)
        for d in accepted:
            old = self._owner.get(d)
            if old is not None and old is not session and self._displace(
                    old, d, "displaced by a newer session", "every device reconnected on a newer session"):
                log_event("session_displaced", session=old.sid, by=session.sid)
            self._owner[d] = session
            session.devices.add(d)
        newly_unavailable = session.available - set(accepted)
        session.available = set(accepted)
        for d in newly_unavailable:
            self._on_device_left(d, "became unavailable")
        for d in [*accepted, *newly_unavailable]:
            self._hosting(d, session.sid, d in session.available)
        admission.accepted_device_ids.extend(accepted)
        if accepted:
            await asyncio.to_thread(self._store.mark_devices_seen, accepted)
        return admission

    def close(self, session: ClientSession, why: str = "stream ended") -> bool:
        """The stream ended (either side): its devices drop out of any round.
        False when the session was already closed."""
        if session.sid not in self.sessions:
            return False
        session.closed = True
        self._forget(session)
        return True

    def release_remote(self, device_ids: Iterable[int], *, why: str) -> list[int]:
        """Devices whose streams another replica took over (they reconnected
        there): each leaves the stream hosting it here exactly as a local
        displacement does (out of any round as `why`; a stream left hosting
        nothing is ended ABORTED and forgotten). Ids no stream hosts here
        are skipped. Returns the ids released."""
        released: list[int] = []
        for d in device_ids:
            old = self._owner.get(d)
            if old is None:
                continue
            released.append(d)
            if self._displace(old, d, why, f"every device {why}"):
                log_event("session_displaced", session=old.sid, by="another replica")
        if released:
            log_event("devices_displaced_remotely", devices=len(released), why=why)
            self._on_changed()
        return released

    def silent_sessions(self, limit_s: float) -> list[ClientSession]:
        """Open sessions with no message for more than `limit_s` seconds."""
        now = self._clock()
        return [s for s in self.sessions.values() if now - s.last_seen > limit_s]

    def end_all(self, message: session_pb2.ServerMessage) -> None:
        """Send `message` to every open stream, then end it gracefully."""
        for s in list(self.sessions.values()):
            s.send(message)
            s.end(grpc.StatusCode.OK, "shutdown")

    # ------------------------------------------------------------------ internals

    async def _look_up(self, unknown: list[int]) -> None:
        if not self._lookups.allow():
            return
        wanted = unknown[: self._max_lookups]

        def work() -> list[DeviceRecord]:
            return [rec for d in wanted if (rec := self._store.get_device(d)) is not None]

        for rec in await asyncio.to_thread(work):
            self.devices[rec.id] = rec
        self.lookups += 1

    def _displace(self, old: ClientSession, device_id: int, why: str, ended: str) -> bool:
        """Release `device_id` from `old`, which hosts it, because it
        reconnected elsewhere; a stream left hosting nothing is ended
        ABORTED ("displaced: " + `ended`) and forgotten (True)."""
        self._release(old, device_id, why)
        if old.devices:
            return False
        old.end(grpc.StatusCode.ABORTED, f"displaced: {ended}")
        self._forget(old)
        return True

    def _release(self, session: ClientSession, device_id: int, why: str) -> None:
        session.devices.discard(device_id)
        session.available.discard(device_id)
        if self._owner.get(device_id) is session:
            del self._owner[device_id]
            self._hosting(device_id, session.sid, None)
        self._on_device_left(device_id, why)

    def _forget(self, session: ClientSession) -> None:
        self.sessions.pop(session.sid, None)
        for d in list(session.devices):
            self._release(session, d, "session closed")
        self._on_changed()


__all__ = [
    "COORDINATOR_VERSION",
    "ClientSession",
    "DeviceRegistry",
    "StreamEnd",
    "StreamListener",
    "check_enroll_request",
    "now_timestamp",
]
