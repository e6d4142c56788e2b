"""The admin service's client of the coordinator's gRPC admin listener
(fedmask.v1.CoordinatorAdmin): live state, the event stream, the top-k
relay, operator actions and the audit of the ones refused here.

One grpc.aio channel per process, opened lazily on the running event loop.
Every call carries the admin credential (bearer token metadata, or the mTLS
client certificate of the channel) and a deadline. A failed call raises
`LiveError` with the gRPC status code, the status detail and the server's
retry hint (`grpc-retry-pushback-ms`), which admin/live_views.py maps to a
problem document.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from google.protobuf.duration_pb2 import Duration

from admin.settings import TOPK_MARGIN_S, CoordinatorLink
from fedmask_proto.v1 import admin_service_pb2 as pb
from fedmask_proto.v1 import admin_service_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class LiveError(Exception):
    """A CoordinatorAdmin call failed."""

    code: grpc.StatusCode
    detail: str
    retry_after_ms: int | None = None

    def __str__(self) -> str:
        return f"{self.code.name}: {self.detail}"


def _error(exc: grpc.aio.AioRpcError) -> LiveError:
    retry: int | None = None
    for key, value in exc.trailing_metadata() or ():
        if key == "grpc-retry-pushback-ms":
            try:
                retry = int(value)
            except (TypeError, ValueError):
                retry = None
    return LiveError(exc.code(), exc.details() or "", retry)


class LiveLink:
    """Calls to CoordinatorAdmin (see the module docstring)."""

    def __init__(self, link: CoordinatorLink) -> None:
        self._link = link
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.CoordinatorAdminAsyncStub | None = None

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        if self._link.token is None:
            return ()
        return (("authorization", f"Bearer {self._link.token.get_secret_value()}"),)

    def _open(self) -> pb_grpc.CoordinatorAdminAsyncStub:
        if self._stub is None:
            link = self._link
            if link.tls_ca is not None:
                creds = grpc.ssl_channel_credentials(
                    root_certificates=link.tls_ca.read_bytes(),
                    private_key=link.tls_key.read_bytes() if link.tls_key is not None else None,
                    certificate_chain=link.tls_cert.read_bytes() if link.tls_cert is not None else None)
                self._channel = grpc.aio.secure_channel(link.address, creds)
            else:
                self._channel = grpc.aio.insecure_channel(link.address)
            self._stub = pb_grpc.CoordinatorAdminStub(self._channel)
        assert self._stub is not None
        return self._stub

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = None
        self._stub = None

    async def live_state(self) -> pb.LiveState:
        try:
            return await self._open().GetLiveState(pb.GetLiveStateRequest(), metadata=self._metadata(),
                                                   timeout=self._link.call_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None

    async def watch_events(self) -> AsyncIterator[pb.AdminEvent]:
        """The coordinator's events, first a snapshot; ends when the
        coordinator ends the stream (LiveError on an error status)."""
        call = self._open().WatchEvents(pb.WatchEventsRequest(), metadata=self._metadata())
        try:
            async for event in call:
                yield event
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None
        finally:
            call.cancel()

    async def top_k(self, *, device_id: int | None = None, user: str | None = None, k: int,
                    exclude_seen: bool) -> pb.RecommendTopKResponse:
        """Exactly one of device_id / user."""
        if (device_id is None) == (user is None):
            raise ValueError("give exactly one of device_id and user")
        wait = self._link.topk_timeout_s
        request = pb.RecommendTopKRequest(k=k, exclude_seen=exclude_seen,
                                          timeout=Duration(seconds=int(wait), nanos=int(wait % 1 * 1e9)))
        if device_id is not None:
            request.device_id = device_id
        else:
            assert user is not None
            request.user_handle = user
        try:
            # the coordinator waits `wait` for the device; the call gets a margin for the relay
            return await self._open().RecommendTopK(request, metadata=self._metadata(), timeout=wait + TOPK_MARGIN_S)
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None

    async def record_refusal(self, operator: str, action: str, reason: str, role: str, suppressed: int) -> int:
        """Audit an operator action refused here (RecordRefusal); the audit entry's id."""
        try:
            answer = await self._open().RecordRefusal(
                pb.RefusalRecord(operator=operator, action=action, reason=reason, role=role, suppressed=suppressed),
                metadata=self._metadata(), timeout=self._link.call_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None
        return int(answer.audit_id)

    async def action(self, action: str, *, operator: str, reason: str,
                     version: int | None = None) -> pb.OperatorActionResponse:
        """pause, resume, abort_round or rollback (with `version`)."""
        stub = self._open()
        meta, timeout = self._metadata(), self._link.call_timeout_s
        try:
            if action == "rollback":
                assert version is not None
                return await stub.Rollback(pb.RollbackRequest(operator=operator, reason=reason, version=version),
                                           metadata=meta, timeout=timeout)
            request = pb.OperatorRequest(operator=operator, reason=reason)
            if action == "pause":
                return await stub.Pause(request, metadata=meta, timeout=timeout)
            if action == "resume":
                return await stub.Resume(request, metadata=meta, timeout=timeout)
            if action == "abort_round":
                return await stub.AbortRound(request, metadata=meta, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None
        raise ValueError(f"unknown action {action!r}")
