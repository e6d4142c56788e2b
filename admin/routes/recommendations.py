"""Top-k recommendations, computed on a device from its private model and
relayed by the coordinator (recommender)."""

import time
from typing import Annotated, Any

from fastapi import APIRouter, Path

from admin import live_views, schemas
from admin.deps import Recommender, Services, ServicesDep, k_q, seen_q
from admin.problems import ProblemError, problem_responses

router = APIRouter()
_TOPK_ERRORS = problem_responses(401, 403, 404, 422, 502, 503, 504)


async def _top_k(services: Services, **target: Any) -> schemas.Recommendations:
    """Ask the coordinator for a top-k of `target` (device_id or user, k,
    exclude_seen), counting it by status and timing it end to end and on the device."""
    started = time.perf_counter()
    status = 500
    try:
        answer = await services.live_call(services.live.top_k(**target), what="top-k")
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


@router.get("/v1/devices/{device_id}/recommendations", response_model=schemas.Recommendations,
            tags=["recommendations"], responses=_TOPK_ERRORS)
async def device_recommendations(_: Recommender, services: ServicesDep,
                                 device_id: Annotated[int, Path(ge=1, le=2**63 - 1)],
                                 k: Annotated[int, k_q] = 10,
                                 exclude_seen: Annotated[bool, seen_q] = True) -> schemas.Recommendations:
    """Top-k computed on the device from its private model, relayed by the coordinator.
    404 unknown device, 503 not connected (Retry-After), 504 no answer in time, 403 the device refuses."""
    return await _top_k(services, device_id=device_id, k=k, exclude_seen=exclude_seen)


@router.get("/v1/users/{user}/recommendations", response_model=schemas.Recommendations, tags=["recommendations"],
            responses=_TOPK_ERRORS)
async def user_recommendations(_: Recommender, services: ServicesDep,
                               user: Annotated[str, Path(min_length=1, max_length=128)],
                               k: Annotated[int, k_q] = 10,
                               exclude_seen: Annotated[bool, seen_q] = True) -> schemas.Recommendations:
    """As for a device, by the user handle the device registered at enrolment."""
    return await _top_k(services, user=user, k=k, exclude_seen=exclude_seen)
