"""Every handler registered by `servicer.register_service` runs under
coordinator/rpc_guard.py (D83), checked on a real grpc.aio server on
127.0.0.1 with fake behaviours for the admin service's methods: a request
with an id out of range is refused INVALID_ARGUMENT before the behaviour
runs, an unexpected exception (unary or streaming) answers INTERNAL with
the fixed text and a logged traceback, and a handler's own status passes
through unchanged."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import pytest

from coordinator.rpc_guard import INTERNAL_DETAIL
from coordinator.servicer import register_service
from fedmask_proto.v1 import admin_service_pb2 as A
from fedmask_proto.v1 import admin_service_pb2_grpc

SECRET = "postgresql://coordinator:hunter2@db/fedmask"
SERVICE = A.DESCRIPTOR.services_by_name["CoordinatorAdmin"]


async def _fails(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
    raise RuntimeError(f"could not connect to {SECRET}")


async def _stream_fails(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    await context.write(A.AdminEvent(sequence=1))
    raise OverflowError(f"Python int too large to convert to SQLite INTEGER ({SECRET})")


async def _refuses(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no round to abort")


calls: list[int] = []


async def _recommend(request: A.RecommendTopKRequest, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
    calls.append(request.device_id)
    return A.RecommendTopKResponse(device_id=request.device_id)


def _handlers() -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
    unary = grpc.unary_unary_rpc_method_handler
    op = (A.OperatorRequest.FromString, A.OperatorActionResponse.SerializeToString)
    return {
        "GetLiveState": unary(_fails, A.GetLiveStateRequest.FromString, A.LiveState.SerializeToString),
        "WatchEvents": grpc.unary_stream_rpc_method_handler(
            _stream_fails, A.WatchEventsRequest.FromString, A.AdminEvent.SerializeToString),
        "RecommendTopK": unary(_recommend, A.RecommendTopKRequest.FromString,
                               A.RecommendTopKResponse.SerializeToString),
        "Pause": unary(_refuses, *op), "Resume": unary(_refuses, *op), "AbortRound": unary(_refuses, *op),
        "Rollback": unary(_refuses, A.RollbackRequest.FromString, A.OperatorActionResponse.SerializeToString),
        "RecordRefusal": unary(_refuses, A.RefusalRecord.FromString, A.RecordRefusalResponse.SerializeToString),
    }


def test_ids_out_of_range_and_unexpected_exceptions_never_reach_a_handler_or_a_peer(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        server = grpc.aio.server()
        register_service(server, SERVICE, _handlers())
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = admin_service_pb2_grpc.CoordinatorAdminStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.GetLiveState(A.GetLiveStateRequest())
                assert (e.value.code(), e.value.details()) == (grpc.StatusCode.INTERNAL, INTERNAL_DETAIL)

                call = stub.WatchEvents(A.WatchEventsRequest())
                first = await call.read()
                assert isinstance(first, A.AdminEvent) and first.sequence == 1
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await call.read()
                assert (e.value.code(), e.value.details()) == (grpc.StatusCode.INTERNAL, INTERNAL_DETAIL)

                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.Pause(A.OperatorRequest(operator="op"))
                assert (e.value.code(), e.value.details()) == (grpc.StatusCode.FAILED_PRECONDITION, "no round to abort")

                for bad in (1 << 63, (1 << 64) - 1):
                    with pytest.raises(grpc.aio.AioRpcError) as e:
                        await stub.RecommendTopK(A.RecommendTopKRequest(device_id=bad, k=3))
                    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                    assert (e.value.details() or "").startswith(f"device_id = {bad}: ")
                assert calls == []
                assert (await stub.RecommendTopK(A.RecommendTopKRequest(device_id=(1 << 63) - 1))).device_id == (1 << 63) - 1
                assert calls == [(1 << 63) - 1]
        finally:
            await server.stop(None)

    with caplog.at_level(logging.INFO, logger="fedmask.coordinator"):
        asyncio.run(main())
    failed = [r for r in caplog.records if "event=rpc_failed" in r.getMessage()]
    assert len(failed) == 2 and all(r.exc_info is not None for r in failed)  # the tracebacks stay here
    assert "event=rpc_refused" in caplog.text
