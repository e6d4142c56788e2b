"""What this process says about itself: its Prometheus metrics (viewer) and
its OpenAPI document (any role)."""

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from admin.deps import AUTH_ERRORS, AnyRole, Reader, ServicesDep

router = APIRouter()


@router.get("/metrics", tags=["health"], response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
                             "description": "Prometheus text format"}, **AUTH_ERRORS})
async def metrics(_: Reader, services: ServicesDep) -> Response:
    """Prometheus metrics of this admin process (the coordinator has its own)."""
    return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/openapi.json", include_in_schema=False)
async def openapi(request: Request, _: AnyRole) -> JSONResponse:
    return JSONResponse(request.app.openapi())
