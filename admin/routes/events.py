"""The coordinator's event stream relayed as Server-Sent Events (viewer)."""

import asyncio
from collections.abc import AsyncIterator

from fastapi import APIRouter
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from admin import live_views
from admin.deps import LIVE_ERRORS, Reader, Services, ServicesDep
from admin.live import LiveError
from admin.problems import ProblemError, problem_responses
from admin.stream_slots import Slot, SlotRefusal
from fedmask_proto.v1 import admin_service_pb2 as pb

router = APIRouter()


@router.get("/v1/events", tags=["federation"], response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
                             "description": "Server-Sent Events: snapshot, stage, committed, aborted, devices, "
                                            "federation; `id` is the coordinator's sequence"}, **LIVE_ERRORS,
                       **problem_responses(429)})
async def events(who: Reader, services: ServicesDep) -> StreamingResponse:
    """Relay the coordinator's event stream (first a snapshot, then every change) as Server-Sent Events.

    Each token holds at most its share of the streams (429 beyond it), and viewers leave the operators'
    reserved ones free (503): settings `event_streams`."""
    settings = services.settings
    slot = services.stream_slots.acquire(who)
    if isinstance(slot, SlotRefusal):
        services.metrics.refused.labels("streams").inc()
        services.refusal_log("streams", f"to {who.name}: {slot.detail}")
        raise ProblemError(slot.status, slot.detail, headers={"Retry-After": str(settings.retry_after_s)})
    try:
        return await _relay(services, slot)
    except BaseException:
        slot.release()
        raise


async def _relay(services: Services, slot: Slot) -> StreamingResponse:
    """The stream, once `slot` is held; the slot is released when the stream ends, however it ends."""
    settings = services.settings
    queue: asyncio.Queue[pb.AdminEvent | LiveError | None] = asyncio.Queue(maxsize=1024)

    async def pump() -> None:
        try:
            async for event in services.live.watch_events():
                await queue.put(event)
            await queue.put(None)
        except LiveError as exc:
            await queue.put(exc)

    task = asyncio.create_task(pump())
    first = await queue.get()
    if isinstance(first, LiveError) or first is None:
        task.cancel()
        if first is None:
            raise ProblemError(503, "the coordinator ended the event stream",
                               headers={"Retry-After": str(settings.retry_after_s)})
        raise live_views.coordinator_unreachable(first, retry_after_s=settings.retry_after_s)

    async def frames() -> AsyncIterator[str]:
        services.metrics.event_streams.inc()
        try:
            yield f"retry: {settings.retry_after_s * 1000}\n\n"
            yield live_views.sse_frame(first)
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), timeout=settings.sse_keepalive_s)
                except TimeoutError:
                    yield ": keep-alive\n\n"
                    continue
                if item is None:
                    return
                if isinstance(item, LiveError):
                    yield f"event: error\ndata: {{\"code\": \"{item.code.name}\"}}\n\n"
                    return
                yield live_views.sse_frame(item)
        finally:
            task.cancel()
            slot.release()
            services.metrics.event_streams.dec()

    def end() -> None:
        task.cancel()
        slot.release()

    # the background task ends the relay also when the client left before the first frame was sent
    return StreamingResponse(frames(), media_type="text/event-stream", background=BackgroundTask(end),
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
