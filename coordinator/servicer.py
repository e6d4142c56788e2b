"""The gRPC servicer: thin (Flower style). Decode, call the Coordinator,
encode, map exceptions to status codes by coordinator/status_codes.py's
DEVICE_LISTENER table:

    InvalidArgument    -> INVALID_ARGUMENT      PermissionDenied -> PERMISSION_DENIED
    ProtocolViolation  -> FAILED_PRECONDITION   Unavailable      -> UNAVAILABLE
    anything else      -> INTERNAL "internal error" (logged with its traceback;
                          the coordinator goes on; no exception text to the
                          peer, for every handler: coordinator/rpc_guard.py)

Every ClientMessage (the Hello, the DeviceProofs and each later message)
with a 64-bit integer outside 0..2^63-1 ends the stream INVALID_ARGUMENT
before the Coordinator sees it (wire/id_bounds.py, D83): no id the
coordinator hands out is larger, and the store could not hold one.

Bytes that do not parse as a ClientMessage end the stream with
INVALID_ARGUMENT (and a log line); over-long messages are refused by the
transport with RESOURCE_EXHAUSTED before they reach the coordinator.

Limits (`settings.limits`, coordinator/limits.py, D24), checked before the
Coordinator is called:
    Enroll, EnrollChallenge
                per-peer rate (one bucket for both)   RESOURCE_EXHAUSTED + retry hint
    Session     per-peer rate of new streams         RESOURCE_EXHAUSTED + retry hint
                open streams (all / per peer)        RESOURCE_EXHAUSTED + retry hint
                no Hello, or no DeviceProofs after the
                SessionChallenge, within hello_timeout_s
                (one deadline for both)              DEADLINE_EXCEEDED
                Hello / CheckIn announcing more than
                max_announced_devices                RESOURCE_EXHAUSTED
                Heartbeat / CheckIn
                over the per-stream rate             RESOURCE_EXHAUSTED + retry hint
                its bearer token removed from
                auth.token_file (checked every half
                heartbeat interval)                  UNAUTHENTICATED
A retry hint is " retry in X s" in the detail and gRPC's
`grpc-retry-pushback-ms` trailer. Every detail sent back is clipped and
made one printable line (`coordinator.logs.sanitize`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError

from coordinator.auth import peer_common_name
from coordinator.credential_watch import (WITHDRAWN, WITHDRAWN_DETAIL, CredentialCheck, end_when_withdrawn,
                                          recheck_interval_s)
from coordinator import status_codes
from coordinator.errors import CoordinatorError
from coordinator.limits import LogBudget, RateLimiter, StreamSlots, TokenBucket, announced_refusal, peer_key
from coordinator.logs import log_event, logger, sanitize
from coordinator.registry import ClientSession, StreamEnd
from coordinator.rpc_guard import guard_handlers, id_refusal
from coordinator.service import Coordinator
from fedmask_proto.v1 import coordinator_service_pb2, enrollment_pb2, session_pb2
from wire.protocol import RETRY_PUSHBACK_KEY

def status_of(exc: CoordinatorError) -> grpc.StatusCode:
    """The device listener's status of `exc` (coordinator/status_codes.py)."""
    return status_codes.status_of(exc, status_codes.DEVICE_LISTENER)


@dataclass(frozen=True)
class _Proofs:
    """A stream's challenge nonce and the DeviceProofs it answered with."""

    nonce: bytes
    proofs: list[session_pb2.DeviceProof]


#: Messages a stream may send at most `limits.message_rate` per second of.
CONTROL_MESSAGES = frozenset({"heartbeat", "check_in"})
#: Refusals a peer can repeat at will are logged at most once per this many
#: seconds per kind (with the count of those not logged).
REFUSAL_LOG_INTERVAL_S = 1.0


def retry_hint(wait_s: float) -> tuple[str, tuple[tuple[str, str], ...]]:
    """(" retry in X s" for the detail, the trailing metadata) of a refusal
    that a wait of `wait_s` seconds would have avoided."""
    ms = max(1, math.ceil(wait_s * 1000))
    return f"; retry in {ms / 1000:.3g} s", ((RETRY_PUSHBACK_KEY, str(ms)),)


async def abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, detail: str,
                trailing_metadata: tuple[tuple[str, str], ...] = ()) -> NoReturn:
    """End the RPC with `code`; the detail is clipped and made one safe
    line (it may quote what the client sent)."""
    if trailing_metadata:
        await context.abort(code, sanitize(detail), trailing_metadata)
    else:
        await context.abort(code, sanitize(detail))
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


class CoordinatorServicer:
    """Applies `settings.limits` (coordinator/limits.py) around the
    Coordinator's calls: per-peer Enroll and new-stream rates, the stream
    caps, the Hello deadline, the per-message cap on announced devices and
    the per-stream rate of control messages."""

    def __init__(self, coordinator: Coordinator, *, clock: Callable[[], float] = time.monotonic,
                 credential: CredentialCheck | None = None) -> None:
        """`credential`: the listener's check of a call's token, when the
        accepted tokens can change (a token file): an open stream whose token
        is withdrawn is ended (coordinator/credential_watch.py)."""
        self.coordinator = coordinator
        self.credential = credential
        limits = coordinator.settings.limits
        self.limits = limits
        self._clock = clock
        self.slots = StreamSlots(limits.max_streams, limits.max_streams_per_peer)
        self._enroll_rate = RateLimiter(limits.enroll_rate, limits.enroll_burst, clock)
        self._session_rate = RateLimiter(limits.session_rate, limits.session_burst, clock)
        self._refusal_logs: dict[str, LogBudget] = {}

    def _log_refusal(self, event: str, why: str, **fields: Any) -> None:
        """A refusal any peer can repeat: logged at most once per second per kind."""
        budget = self._refusal_logs.setdefault(f"{event}:{why}", LogBudget(REFUSAL_LOG_INTERVAL_S, self._clock))
        suppressed = budget.take()
        if suppressed is None:
            return
        extra = {"suppressed": suppressed} if suppressed else {}
        log_event(event, logging.WARNING, why=why, **fields, **extra)

    async def EnrollChallenge(
        self, request: enrollment_pb2.EnrollChallengeRequest, context: grpc.aio.ServicerContext
    ) -> enrollment_pb2.EnrollChallengeResponse:
        await self._enroll_rate_check(context)
        try:
            return self.coordinator.enroll_challenge()
        except CoordinatorError as exc:
            await abort(context, status_of(exc), str(exc))

    async def _enroll_rate_check(self, context: grpc.aio.ServicerContext) -> None:
        wait = self._enroll_rate.take(peer_key(context.peer(), peer_common_name(context)))
        if wait > 0:
            self._log_refusal("enroll_refused", "enroll rate limit", peer=context.peer())
            hint, trailer = retry_hint(wait)
            await abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"too many Enroll calls from this peer (limits.enroll_rate){hint}", trailer)

    async def Enroll(
        self, request: enrollment_pb2.EnrollRequest, context: grpc.aio.ServicerContext
    ) -> enrollment_pb2.EnrollResponse:
        client_id = peer_common_name(context)
        await self._enroll_rate_check(context)
        try:
            return await self.coordinator.enroll(request, client_id=client_id)
        except CoordinatorError as exc:
            log_event("enroll_refused", logging.WARNING, peer=context.peer(), why=str(exc))
            await abort(context, status_of(exc), str(exc))
        except Exception:
            logger.exception("event=enroll_failed peer=%s", context.peer())
            await abort(context, grpc.StatusCode.INTERNAL, "internal error")

    async def Session(self, request_iterator: object, context: grpc.aio.ServicerContext) -> None:
        peer = context.peer()
        key = peer_key(peer, peer_common_name(context))
        wait = self._session_rate.take(key)
        if wait > 0:
            self._log_refusal("session_refused", "session rate limit", peer=peer)
            hint, trailer = retry_hint(wait)
            await abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"too many new Session streams from this peer (limits.session_rate){hint}", trailer)
        refusal = self.slots.acquire(key)
        if refusal is not None:
            self._log_refusal("session_refused", "stream cap", peer=peer, open=self.slots.open)
            hint, trailer = retry_hint(self.limits.hello_timeout_s)
            await abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, refusal + hint, trailer)
        try:
            # The stream holds a slot: say so at once (a client can await the
            # initial metadata to know it was admitted past the limits).
            await context.send_initial_metadata(())
            await self._session(context, peer)
        finally:
            self.slots.release(key)

    async def _session(self, context: grpc.aio.ServicerContext, peer: str) -> None:
        coord = self.coordinator
        deadline = self._clock() + self.limits.hello_timeout_s
        try:
            first = await asyncio.wait_for(context.read(), self.limits.hello_timeout_s)
        except TimeoutError:
            self._log_refusal("session_refused", "no hello in time", peer=peer)
            await abort(context, grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"no Hello within {self.limits.hello_timeout_s:g} s (limits.hello_timeout_s)")
        except DecodeError:
            log_event("session_refused", logging.WARNING, peer=peer, why="malformed ClientMessage")
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "malformed ClientMessage")
        except Exception:  # the client went away before saying anything
            return
        if first is grpc.aio.EOF:
            return
        if first.WhichOneof("message") != "hello":
            log_event("session_refused", logging.WARNING, peer=peer, why="first message is not hello")
            await abort(context, grpc.StatusCode.FAILED_PRECONDITION, "the first ClientMessage must be hello")
        too_many = announced_refusal(len(first.hello.available_device_ids), self.limits.max_announced_devices)
        if too_many is not None:
            log_event("session_refused", logging.WARNING, peer=peer, why=too_many)
            await abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, too_many)
        await self._check_ids(context, peer, first)
        proofs = await self._challenge(context, peer, first.hello, deadline)
        try:
            session = await coord.open_session(first.hello, nonce=proofs.nonce, proofs=proofs.proofs,
                                               client_id=peer_common_name(context), peer=peer)
        except CoordinatorError as exc:
            log_event("session_refused", logging.WARNING, peer=peer, why=str(exc))
            await abort(context, status_of(exc), str(exc))
        trailer: list[tuple[str, str]] = []
        reader = asyncio.create_task(self._read(session, context, trailer),
                                     name=f"fedmask-session-{session.sid}-reader")
        watch = self._watch_credential(session, context)
        end = StreamEnd(grpc.StatusCode.OK)
        try:
            while True:
                item = await session.outbox.get()
                if isinstance(item, StreamEnd):
                    end = item
                    break
                await context.write(item)
        except asyncio.CancelledError:  # the RPC was terminated under us
            end = StreamEnd(grpc.StatusCode.CANCELLED,
                            "stream cancelled by the transport (client gone, or a message over the receive limit)")
        except Exception as exc:  # client gone mid-write; the exception's name is logged, not sent
            log_event("session_write_failed", logging.INFO, session=session.sid, error=type(exc).__name__)
            end = StreamEnd(grpc.StatusCode.CANCELLED, "write failed (the client is gone)")
        finally:
            reader.cancel()
            if watch is not None:
                watch.cancel()
            coord.close_session(session, end.detail or end.code.name.lower())
        if end.code is not grpc.StatusCode.OK:
            await abort(context, end.code, end.detail, tuple(trailer))

    def _watch_credential(self, session: ClientSession, context: grpc.aio.ServicerContext) -> asyncio.Task[None] | None:
        """The task that ends `session` once its bearer token is withdrawn
        (None when tokens cannot be withdrawn)."""
        if self.credential is None:
            return None

        def withdrawn() -> None:
            log_event("session_ended", logging.WARNING, session=session.sid, why=WITHDRAWN)
            session.end(grpc.StatusCode.UNAUTHENTICATED, WITHDRAWN_DETAIL)

        period = recheck_interval_s(self.coordinator.settings.heartbeat_interval)
        return asyncio.create_task(end_when_withdrawn(self.credential, context.invocation_metadata(), period,
                                                      withdrawn), name=f"fedmask-session-{session.sid}-credential")

    async def _challenge(self, context: grpc.aio.ServicerContext, peer: str, hello: session_pb2.Hello,
                         deadline: float) -> _Proofs:
        """Send the stream's SessionChallenge and read its DeviceProofs (by
        `deadline`, the Hello's): the nonce and the proofs, else the stream
        is refused (an unserved version before any challenge)."""
        try:
            self.coordinator.check_hello(hello)
        except CoordinatorError as exc:
            log_event("session_refused", logging.WARNING, peer=peer, why=str(exc))
            await abort(context, status_of(exc), str(exc))
        nonce = self.coordinator.session_nonce()
        await context.write(session_pb2.ServerMessage(challenge=session_pb2.SessionChallenge(nonce=nonce)))
        try:
            second = await asyncio.wait_for(context.read(), max(0.0, deadline - self._clock()))
        except TimeoutError:
            self._log_refusal("session_refused", "no proof in time", peer=peer)
            await abort(context, grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"no DeviceProofs within {self.limits.hello_timeout_s:g} s of the stream's start "
                        "(limits.hello_timeout_s)")
        except DecodeError:
            log_event("session_refused", logging.WARNING, peer=peer, why="malformed ClientMessage")
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "malformed ClientMessage")
        except Exception as exc:  # the client went away before its proofs
            self._log_refusal("session_refused", "read failed", peer=peer, error=type(exc).__name__)
            await abort(context, grpc.StatusCode.CANCELLED, "read failed (the client is gone)")
        if second is grpc.aio.EOF:
            await abort(context, grpc.StatusCode.CANCELLED, "the client closed the stream before its proofs")
        if second.WhichOneof("message") != "proof":
            log_event("session_refused", logging.WARNING, peer=peer, why="second message is not proof")
            await abort(context, grpc.StatusCode.FAILED_PRECONDITION,
                        "the second ClientMessage must be proof (the answer to the SessionChallenge, fedmask.v1.1)")
        too_many = announced_refusal(len(second.proof.proofs), self.limits.max_announced_devices)
        if too_many is not None:
            log_event("session_refused", logging.WARNING, peer=peer, why=too_many)
            await abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, too_many)
        await self._check_ids(context, peer, second)
        return _Proofs(nonce, list(second.proof.proofs))

    async def _check_ids(self, context: grpc.aio.ServicerContext, peer: str,
                         message: session_pb2.ClientMessage) -> None:
        """Refuse the stream (INVALID_ARGUMENT) before it is open when the
        message carries a 64-bit integer out of range (D83)."""
        refusal = id_refusal(message)
        if refusal is not None:
            self._log_refusal("session_refused", "id out of range", peer=peer, detail=refusal)
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, refusal)

    async def _read(self, session: ClientSession, context: grpc.aio.ServicerContext,
                    trailer: list[tuple[str, str]]) -> None:
        """The stream's receive loop; a refusal that has a retry hint puts
        its trailing metadata into `trailer` before ending the session."""
        coord = self.coordinator
        limits = self.limits
        bucket = TokenBucket.full(limits.message_rate, limits.message_burst, self._clock())
        try:
            while True:
                try:
                    msg = await context.read()
                except DecodeError:
                    log_event("session_violation", logging.WARNING, session=session.sid, why="malformed ClientMessage")
                    session.end(grpc.StatusCode.INVALID_ARGUMENT, "malformed ClientMessage")
                    return
                if msg is grpc.aio.EOF:
                    # a half-close; the transport refusing a message over the receive
                    # limit (RESOURCE_EXHAUSTED to the client) looks the same from here
                    session.end(grpc.StatusCode.OK, "client closed the stream (or sent a message over the receive limit)")
                    return
                kind = msg.WhichOneof("message")
                if kind in CONTROL_MESSAGES:
                    wait = bucket.take(self._clock())
                    if wait > 0:
                        log_event("session_violation", logging.WARNING, session=session.sid,
                                  why="message rate limit", kind=kind)
                        hint, pushback = retry_hint(wait)
                        trailer.extend(pushback)
                        session.end(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                    f"too many {kind} messages on this stream (limits.message_rate){hint}")
                        return
                if kind == "check_in":
                    too_many = announced_refusal(max(len(msg.check_in.available_device_ids), len(msg.check_in.proofs)),
                                                 limits.max_announced_devices)
                    if too_many is not None:
                        log_event("session_violation", logging.WARNING, session=session.sid, why=too_many)
                        session.end(grpc.StatusCode.RESOURCE_EXHAUSTED, too_many)
                        return
                refusal = id_refusal(msg)
                if refusal is not None:  # before anything looks an id up (D83)
                    self._log_refusal("session_violation", "id out of range", session=session.sid, detail=refusal)
                    session.end(grpc.StatusCode.INVALID_ARGUMENT, refusal)
                    return
                try:
                    await coord.handle(session, msg)
                except CoordinatorError as exc:
                    log_event("session_violation", logging.WARNING, session=session.sid, why=str(exc))
                    session.end(status_of(exc), str(exc))
                    return
                except Exception:
                    logger.exception("event=handler_failed session=%s", session.sid)
                    session.end(grpc.StatusCode.INTERNAL, "internal error")
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # transport error (client vanished, bad bytes); its name is logged, not sent
            log_event("session_read_failed", logging.INFO, session=session.sid, error=type(exc).__name__)
            session.end(grpc.StatusCode.CANCELLED, "read failed (transport error)")


_SERVICE = coordinator_service_pb2.DESCRIPTOR.services_by_name["CoordinatorService"]


def add_to_server(coordinator: Coordinator, server: grpc.aio.Server, *,
                  credential: CredentialCheck | None = None) -> CoordinatorServicer:
    """Serve fedmask.v1.CoordinatorService on `server` with a new servicer
    (`credential`: as CoordinatorServicer's).

    Registers the handlers exactly as the generated
    add_CoordinatorServiceServicer_to_server does. It is done here because
    Session uses grpc.aio's read/write streaming API (the handler is a
    coroutine returning None), which the generated servicer base class types
    as returning an iterator; CoordinatorServicer therefore does not derive
    from that base. Raises RuntimeError if the service gains a method that
    is not registered here."""
    servicer = CoordinatorServicer(coordinator, credential=credential)
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "Enroll": grpc.unary_unary_rpc_method_handler(
            servicer.Enroll,
            request_deserializer=enrollment_pb2.EnrollRequest.FromString,
            response_serializer=enrollment_pb2.EnrollResponse.SerializeToString,
        ),
        "EnrollChallenge": grpc.unary_unary_rpc_method_handler(
            servicer.EnrollChallenge,
            request_deserializer=enrollment_pb2.EnrollChallengeRequest.FromString,
            response_serializer=enrollment_pb2.EnrollChallengeResponse.SerializeToString,
        ),
        "Session": grpc.stream_stream_rpc_method_handler(
            servicer.Session,
            request_deserializer=session_pb2.ClientMessage.FromString,
            response_serializer=session_pb2.ServerMessage.SerializeToString,
        ),
    }
    register_service(server, _SERVICE, handlers)
    return servicer


def register_service(server: grpc.aio.Server, service: ServiceDescriptor,
                     handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]) -> None:
    """Register `handlers` (method name -> handler) for `service` on
    `server` as the generated add_*_to_server functions do (a generic
    handler and the registered method handlers), each one run under
    coordinator/rpc_guard.py (requests with ids out of range refused,
    unexpected exceptions answered INTERNAL with a fixed text). RuntimeError,
    and nothing registered, if a method of the service has no handler."""
    unregistered = {m.name for m in service.methods} - set(handlers)
    if unregistered:
        raise RuntimeError(f"{service.full_name} methods without a handler: {sorted(unregistered)}")
    guarded = guard_handlers(service.full_name, handlers)  # id bounds, no exception text to a peer (D83)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, guarded),))
    server.add_registered_method_handlers(service.full_name, guarded)

