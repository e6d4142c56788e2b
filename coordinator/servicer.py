"""The gRPC servicer: thin (Flower style). Decode, call the Coordinator,
encode, map exceptions to status codes:

    InvalidArgument    -> INVALID_ARGUMENT      PermissionDenied -> PERMISSION_DENIED
    ProtocolViolation  -> FAILED_PRECONDITION   Unavailable      -> UNAVAILABLE
    anything else      -> INTERNAL (logged with its traceback; the coordinator goes on)

Bytes that do not parse as a ClientMessage end the stream with
INVALID_ARGUMENT (and a log line); over-long messages are refused by the
transport with RESOURCE_EXHAUSTED before they reach the coordinator.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from google.protobuf.message import DecodeError

from coordinator.auth import peer_common_name
from coordinator.errors import CoordinatorError, InvalidArgument, PermissionDenied, ProtocolViolation, Unavailable
from coordinator.logs import log_event, logger
from coordinator.registry import ClientSession, StreamEnd
from coordinator.service import Coordinator
from fedmask_proto.v1 import coordinator_service_pb2_grpc, enrollment_pb2

_STATUS = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    ProtocolViolation: grpc.StatusCode.FAILED_PRECONDITION,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
}


def status_of(exc: CoordinatorError) -> grpc.StatusCode:
    for cls, code in _STATUS.items():
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


class CoordinatorServicer(coordinator_service_pb2_grpc.CoordinatorServiceServicer):
    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator

    async def Enroll(
        self, request: enrollment_pb2.EnrollRequest, context: grpc.aio.ServicerContext
    ) -> enrollment_pb2.EnrollResponse:
        try:
            return await self.coordinator.enroll(request, client_id=peer_common_name(context))
        except CoordinatorError as exc:
            log_event("enroll_refused", logging.WARNING, peer=context.peer(), why=str(exc))
            await context.abort(status_of(exc), str(exc))
        except Exception:
            logger.exception("event=enroll_failed peer=%s", context.peer())
            await context.abort(grpc.StatusCode.INTERNAL, "internal error")
        raise AssertionError("unreachable")  # pragma: no cover

    async def Session(self, request_iterator, context: grpc.aio.ServicerContext) -> None:
        coord = self.coordinator
        peer = context.peer()
        try:
            first = await context.read()
        except DecodeError:
            log_event("session_refused", logging.WARNING, peer=peer, why="malformed ClientMessage")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed ClientMessage")
        except Exception:  # the client went away before saying anything
            return
        if first is grpc.aio.EOF:
            return
        if first.WhichOneof("message") != "hello":
            log_event("session_refused", logging.WARNING, peer=peer, why="first message is not hello")
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the first ClientMessage must be hello")
        try:
            session = await coord.open_session(first.hello, client_id=peer_common_name(context), peer=peer)
        except CoordinatorError as exc:
            log_event("session_refused", logging.WARNING, peer=peer, why=str(exc))
            await context.abort(status_of(exc), str(exc))
        reader = asyncio.create_task(self._read(session, context), name=f"fedmask-session-{session.sid}-reader")
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
        except Exception as exc:  # client gone mid-write
            end = StreamEnd(grpc.StatusCode.CANCELLED, type(exc).__name__)
        finally:
            reader.cancel()
            coord.close_session(session, end.detail or end.code.name.lower())
        if end.code is not grpc.StatusCode.OK:
            await context.abort(end.code, end.detail)

    async def _read(self, session: ClientSession, context: grpc.aio.ServicerContext) -> None:
        coord = self.coordinator
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
        except Exception as exc:  # transport error (client vanished, bad bytes)
            session.end(grpc.StatusCode.CANCELLED, f"read failed: {type(exc).__name__}")


def add_to_server(coordinator: Coordinator, server: grpc.aio.Server) -> CoordinatorServicer:
    servicer = CoordinatorServicer(coordinator)
    coordinator_service_pb2_grpc.add_CoordinatorServiceServicer_to_server(servicer, server)
    return servicer

