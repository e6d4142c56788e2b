"""The gRPC servicer of fedmask.v1.CoordinatorAdmin (admin_service.proto):
thin, like `servicer.py`. Decode, call the operator actions
(operator_actions.py) or the live view, encode; errors become status codes
by coordinator/status_codes.py (`admin_status`), a device that is not
connected with a grpc-retry-pushback-ms hint, bugs INTERNAL (logged with
their traceback).

It takes what it calls, not the `Coordinator`: the `OperatorActions`, the
live view (a function returning the LiveState), the event hub and the
metrics.

WatchEvents writes a `snapshot` event first (its sequence is that of the
latest event the snapshot includes), then each event of the hub; a watcher
that falls behind is ended with RESOURCE_EXHAUSTED, the shutdown ends every
watcher with UNAVAILABLE, more than admin.max_watchers watchers are refused
with RESOURCE_EXHAUSTED, and a watcher whose admin token was removed from
admin.token_file is ended with UNAUTHENTICATED within a heartbeat interval
(coordinator/credential_watch.py). RecordRefusal audits an operator action
the admin service refused at its REST layer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import grpc

from coordinator.credential_watch import WITHDRAWN, WITHDRAWN_DETAIL, CredentialCheck
from coordinator.errors import CoordinatorError, DeviceNotConnected, InvalidArgument, UserNotConnected
from coordinator.events import EventHub, HubClosed, Watcher, WatcherDropped, WatcherLimit
from coordinator.logs import log_event, logger
from coordinator.metrics import CoordinatorMetrics
from coordinator.operator_actions import ActionOutcome, OperatorActions, Recommendation
from coordinator.servicer import abort, register_service
from coordinator.status_codes import admin_status
from fedmask_proto.v1 import admin_service_pb2 as A
from wire.protocol import RETRY_PUSHBACK_KEY
from wire.round_task import seconds_to_duration

#: How long an admin client should wait before asking again for a device
#: that is not connected (the grpc-retry-pushback-ms trailer).
RETRY_NOT_CONNECTED_MS = 2000

def recommendation_proto(rec: Recommendation) -> A.RecommendTopKResponse:
    """The answer to RecommendTopK: ranked items, never a score (D84)."""
    a = rec.answer
    out = A.RecommendTopKResponse(device_id=rec.device_id, user_handle=rec.handle, model_version=a.model_version,
                                  latency=seconds_to_duration(max(0.0, rec.latency_s)),
                                  recommendation_id=rec.recommendation_id, seen_excluded=a.seen_excluded)
    for rank, index in enumerate(a.item_ids, start=1):
        out.items.add(
            item_id=a.dataset_item_ids[rank - 1] if a.dataset_item_ids else str(index),
            title=a.titles[rank - 1] if a.titles else "",
            rank=rank, item_index=index,
        )
    return out


class AdminServicer:
    """See the module doc."""

    def __init__(self, actions: OperatorActions, *, live: Callable[[], A.LiveState], events: EventHub,
                 metrics: CoordinatorMetrics, credential: CredentialCheck | None = None,
                 recheck_s: float = 5.0) -> None:
        """`credential`: the listener's check of a call's token, when the
        accepted tokens can change (admin.token_file): a WatchEvents stream
        whose token is withdrawn is ended within `recheck_s`
        (coordinator/credential_watch.py)."""
        self.actions = actions
        self.live = live
        self.events = events
        self.metrics = metrics
        self.credential = credential
        self.recheck_s = recheck_s

    async def _fail(self, context: grpc.aio.ServicerContext[Any, Any], exc: BaseException, method: str) -> None:
        if isinstance(exc, CoordinatorError):
            code = admin_status(exc)
            trailer: tuple[tuple[str, str], ...] = ()
            if code is grpc.StatusCode.UNAVAILABLE and isinstance(exc, DeviceNotConnected | UserNotConnected):
                trailer = ((RETRY_PUSHBACK_KEY, str(RETRY_NOT_CONNECTED_MS)),)
            log_event("admin_refused", logging.INFO, method=method, code=code.name, why=str(exc))
            await abort(context, code, str(exc), trailer)
        logger.exception("event=admin_failed method=%s", method)
        await abort(context, grpc.StatusCode.INTERNAL, "internal error")

    async def GetLiveState(self, request: A.GetLiveStateRequest, context: grpc.aio.ServicerContext[Any, Any]) -> A.LiveState:
        try:
            return self.live()
        except Exception as exc:
            await self._fail(context, exc, "GetLiveState")
            raise AssertionError("unreachable") from exc  # pragma: no cover

    async def WatchEvents(self, request: A.WatchEventsRequest, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        hub, metrics = self.events, self.metrics
        try:
            watcher = hub.watch()
        except WatcherLimit as exc:
            await abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except HubClosed as exc:
            await abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))
        metrics.watchers.set(hub.watchers)
        code, detail = None, ""
        try:
            snapshot = A.AdminEvent(sequence=hub.sequence, snapshot=self.live())
            snapshot.at.CopyFrom(snapshot.snapshot.as_of)
            await context.write(snapshot)
            if self.credential is None:
                while True:
                    await context.write(await watcher.next())
            await self._relay_while_accepted(self.credential, watcher, context)
            log_event("watch_ended", logging.WARNING, why=WITHDRAWN)
            code, detail = grpc.StatusCode.UNAUTHENTICATED, WITHDRAWN_DETAIL
        except WatcherDropped as exc:
            metrics.watchers_dropped.inc()
            code, detail = grpc.StatusCode.RESOURCE_EXHAUSTED, f"{exc}; watch again"
        except HubClosed as exc:
            code, detail = grpc.StatusCode.UNAVAILABLE, str(exc)
        finally:
            hub.unwatch(watcher)
            metrics.watchers.set(hub.watchers)
        if code is not None:
            await abort(context, code, detail)

    async def _relay_while_accepted(self, accepts: CredentialCheck, watcher: Watcher,
                                    context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """Write the watcher's events until the call's token is no longer
        accepted (checked at least every `recheck_s`); returns then."""
        metadata = context.invocation_metadata()
        loop = asyncio.get_running_loop()
        check_at = loop.time() + self.recheck_s
        while True:
            try:
                event = await asyncio.wait_for(watcher.next(), max(0.0, check_at - loop.time()))
            except TimeoutError:
                event = None
            if loop.time() >= check_at:
                if not accepts(metadata):
                    return
                check_at = loop.time() + self.recheck_s
            if event is not None:
                await context.write(event)

    async def RecommendTopK(self, request: A.RecommendTopKRequest,
                            context: grpc.aio.ServicerContext[Any, Any]) -> A.RecommendTopKResponse:
        target = request.WhichOneof("target")
        try:
            if target is None:
                raise InvalidArgument("name the device: device_id or user_handle")
            timeout = request.timeout.ToTimedelta().total_seconds() if request.HasField("timeout") else None
            rec = await self.actions.recommend(
                device_id=request.device_id if target == "device_id" else None,
                handle=request.user_handle if target == "user_handle" else None,
                k=int(request.k), exclude_seen=request.exclude_seen, timeout_s=timeout,
            )
            return recommendation_proto(rec)
        except Exception as exc:
            await self._fail(context, exc, "RecommendTopK")
            raise AssertionError("unreachable") from exc  # pragma: no cover

    async def _action(self, context: grpc.aio.ServicerContext[Any, Any], method: str,
                      result: Any) -> A.OperatorActionResponse:
        try:
            done: ActionOutcome = await result
            return A.OperatorActionResponse(state=self.live(), changed=done.changed,
                                            audit_id=done.audit.id, new_model_version=done.new_model_version or 0)
        except Exception as exc:
            await self._fail(context, exc, method)
            raise AssertionError("unreachable") from exc  # pragma: no cover

    async def Pause(self, request: A.OperatorRequest, context: grpc.aio.ServicerContext[Any, Any]) -> A.OperatorActionResponse:
        return await self._action(context, "Pause", self.actions.pause(request.operator, request.reason))

    async def Resume(self, request: A.OperatorRequest, context: grpc.aio.ServicerContext[Any, Any]) -> A.OperatorActionResponse:
        return await self._action(context, "Resume", self.actions.resume(request.operator, request.reason))

    async def AbortRound(self, request: A.OperatorRequest,
                         context: grpc.aio.ServicerContext[Any, Any]) -> A.OperatorActionResponse:
        return await self._action(context, "AbortRound", self.actions.abort_round(request.operator, request.reason))

    async def Rollback(self, request: A.RollbackRequest,
                       context: grpc.aio.ServicerContext[Any, Any]) -> A.OperatorActionResponse:
        return await self._action(context, "Rollback",
                                  self.actions.rollback(int(request.version), request.operator, request.reason))

    async def RecordRefusal(self, request: A.RefusalRecord,
                            context: grpc.aio.ServicerContext[Any, Any]) -> A.RecordRefusalResponse:
        try:
            entry = await self.actions.record_refusal(request.operator, request.action, request.reason,
                                                      role=request.role, suppressed=int(request.suppressed))
            return A.RecordRefusalResponse(audit_id=entry.id)
        except Exception as exc:
            await self._fail(context, exc, "RecordRefusal")
            raise AssertionError("unreachable") from exc  # pragma: no cover


_SERVICE = A.DESCRIPTOR.services_by_name["CoordinatorAdmin"]
SERVICE_NAME = _SERVICE.full_name


def add_admin_to_server(s: AdminServicer, server: grpc.aio.Server) -> AdminServicer:
    """Serve fedmask.v1.CoordinatorAdmin by `s` on `server` (registered by
    hand, as in servicer.add_to_server: WatchEvents uses grpc.aio's write
    API). RuntimeError if the service has a method without a handler here."""
    unary = grpc.unary_unary_rpc_method_handler
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "GetLiveState": unary(s.GetLiveState, A.GetLiveStateRequest.FromString, A.LiveState.SerializeToString),
        "WatchEvents": grpc.unary_stream_rpc_method_handler(
            s.WatchEvents, A.WatchEventsRequest.FromString, A.AdminEvent.SerializeToString),
        "RecommendTopK": unary(s.RecommendTopK, A.RecommendTopKRequest.FromString,
                               A.RecommendTopKResponse.SerializeToString),
        "Pause": unary(s.Pause, A.OperatorRequest.FromString, A.OperatorActionResponse.SerializeToString),
        "Resume": unary(s.Resume, A.OperatorRequest.FromString, A.OperatorActionResponse.SerializeToString),
        "AbortRound": unary(s.AbortRound, A.OperatorRequest.FromString, A.OperatorActionResponse.SerializeToString),
        "Rollback": unary(s.Rollback, A.RollbackRequest.FromString, A.OperatorActionResponse.SerializeToString),
        "RecordRefusal": unary(s.RecordRefusal, A.RefusalRecord.FromString,
                               A.RecordRefusalResponse.SerializeToString),
    }
    register_service(server, _SERVICE, handlers)
    return s


__all__ = ["AdminServicer", "SERVICE_NAME", "add_admin_to_server", "recommendation_proto"]
