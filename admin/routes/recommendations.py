"""Top-k recommendations, computed on a device from its private model and
relayed by the coordinator (recommender).

What a recommender learns is decided on the device (D84): ranked items and
their titles, never scores; at most `max_top_k` items here, at most the
device's own cap there; the user's seen items left out unless the device's
policy lets a caller ask for them. `exclude_seen=false` is a wish: where
the device does not grant it, the answer says `seen_excluded: true`. A user
handle that no connected device has answers 503, whether it is unknown or
its device is offline: the same status, body and timing."""

import time
from typing import Annotated, Any

from fastapi import APIRouter, Path

from admin import live_views, schemas
from admin.deps import Recommender, Services, ServicesDep, k_q, seen_q
from admin.problems import ProblemError, problem_responses
from admin.settings import AdminSettings

_TOPK_ERRORS = problem_responses(401, 403, 404, 422, 502, 503, 504)
#: k when the request names none (or the cap, when that is smaller).
DEFAULT_K = 10


async def _top_k(services: Services, **target: Any) -> schemas.Recommendations:
    """Ask the coordinator holding the device's stream (admin/topk_routing.py)
    for a top-k of `target` (device_id or user, k, exclude_seen), counting it
    by status and timing it end to end and on the device."""
    started = time.perf_counter()
    status = 500
    try:
        link = await services.topk_router.link(device_id=target.get("device_id"), user=target.get("user"))
        answer = await services.live_call(link.top_k(**target), what="top-k")
        status = 200
    except ProblemError as exc:
        status = exc.status
        raise
    finally:
        elapsed = time.perf_counter() - started
        services.metrics.topk.labels(str(status)).inc()
        services.metrics.topk_seconds.observe(elapsed)
    result = live_views.recommendations(answer, total_ms=elapsed * 1000.0)
    services.metrics.topk_device_seconds.observe(result.latency_ms / 1000.0)
    return result


def router(settings: AdminSettings) -> APIRouter:
    """The routes, `k` bounded by `settings.max_top_k`."""
    limit_k = k_q(settings)
    default_k = min(DEFAULT_K, settings.max_top_k)

    async def device_recommendations(_: Recommender, services: ServicesDep,
                                     device_id: Annotated[int, Path(ge=1, le=2**63 - 1)],
                                     k: Annotated[int, limit_k] = default_k,
                                     exclude_seen: Annotated[bool, seen_q] = True) -> schemas.Recommendations:
        """Top-k computed on the device from its private model, relayed by the coordinator: ranked items,
        no scores. 404 unknown device, 503 not connected (Retry-After), 504 no answer in time, 403 the device
        refuses."""
        return await _top_k(services, device_id=device_id, k=k, exclude_seen=exclude_seen)

    async def user_recommendations(_: Recommender, services: ServicesDep,
                                   user: Annotated[str, Path(min_length=1, max_length=128)],
                                   k: Annotated[int, limit_k] = default_k,
                                   exclude_seen: Annotated[bool, seen_q] = True) -> schemas.Recommendations:
        """As for a device, by the user handle the device registered at enrolment. A handle that no
        connected device has is a 503 (Retry-After), unknown and offline handles alike."""
        return await _top_k(services, user=user, k=k, exclude_seen=exclude_seen)

    routes = APIRouter()
    routes.add_api_route("/v1/devices/{device_id}/recommendations", device_recommendations,
                         response_model=schemas.Recommendations, tags=["recommendations"], responses=_TOPK_ERRORS)
    routes.add_api_route("/v1/users/{user}/recommendations", user_recommendations,
                         response_model=schemas.Recommendations, tags=["recommendations"], responses=_TOPK_ERRORS)
    return routes
