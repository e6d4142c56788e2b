"""Open probes: liveness (`/healthz`) and readiness (`/readyz`)."""

import asyncio

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from admin import schemas
from admin.deps import ServicesDep
from admin.live import LiveError
from coordinator.store import StoreError

router = APIRouter()


@router.get("/healthz", response_model=schemas.Health, tags=["health"])
async def healthz() -> schemas.Health:
    """The process is alive (no dependency is checked)."""
    return schemas.Health()


@router.get("/readyz", response_model=schemas.Readiness, tags=["health"],
            responses={503: {"model": schemas.Readiness, "description": "Not ready"}})
async def readyz(services: ServicesDep) -> JSONResponse:
    """Ready when the store answers a read and the coordinator's admin listener answers."""
    problems: list[str] = []
    store_ok = coordinator_ok = True
    try:
        await asyncio.wait_for(run_in_threadpool(lambda: services.store.list_rounds(limit=1)), timeout=5)
    except (StoreError, TimeoutError) as exc:
        store_ok = False
        problems.append(f"store: {type(exc).__name__}")
    try:
        await services.live.live_state()
    except LiveError as exc:
        coordinator_ok = False
        problems.append(f"coordinator: {exc.code.name}")
    body = schemas.Readiness(ready=store_ok and coordinator_ok, store=store_ok, coordinator=coordinator_ok,
                             detail=problems)
    return JSONResponse(body.model_dump(), status_code=200 if body.ready else 503)
