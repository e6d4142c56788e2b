"""The FastAPI application of `fedmask admin`: `create_app(settings)`.

Routes (all JSON under /v1 unless said; errors are problem documents):
  open        GET /healthz, GET /readyz, GET / (the dashboard page and its
              static files: no data in them; the page asks for a token)
  viewer      GET /metrics, /openapi.json, /v1/federation, /v1/rounds,
              /v1/rounds/current, /v1/rounds/{n}, /v1/models,
              /v1/models/{version}, /v1/models/{version}/parameters,
              /v1/privacy, /v1/events (SSE), /v1/audit
  recommender GET /v1/devices/{device_id}/recommendations,
              /v1/users/{user}/recommendations
  operator    everything, plus POST /v1/federation/pause, /resume,
              /v1/rounds/current/abort, /v1/models/{version}/rollback

Stateless: history is read from the coordinator's store through its
interface (read methods only, in worker threads); live state, events,
top-k and actions go to the coordinator's admin listener (admin/live.py).

This module assembles the app: its services (admin/deps.py), error
handlers, metrics middleware, the routers of admin/routes/, one per area,
and in front of everything the request gate (admin/request_gate.py: body
size, concurrency and time, before a token is looked at; D82).
"""

import contextlib
from collections.abc import AsyncIterator

from fastapi import Depends, FastAPI
from starlette.concurrency import run_in_threadpool

from admin.deps import build_services, reject_unknown_query_parameters
from admin.live import LiveLink
from admin.metrics import MetricsMiddleware
from admin.problems import install
from admin.request_gate import RequestGate
from admin.routes import (actions, dashboard, events, federation, health, ledger, meta, model_versions,
                          recommendations)
from admin.settings import AdminSettings
from coordinator.store import Store


def create_app(settings: AdminSettings, *, store: Store | None = None, live: LiveLink | None = None) -> FastAPI:
    """The app; `store` and `live` default to the ones the settings name."""
    services = build_services(settings, store=store, live=live)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await services.refusal_audit.drain()
        await services.topk_router.close()
        await services.live.close()
        await run_in_threadpool(services.store.close)

    app = FastAPI(
        title="fedmask admin", version="1", lifespan=lifespan,
        dependencies=[Depends(reject_unknown_query_parameters)], docs_url=None, redoc_url=None, openapi_url=None,
        description="Watch the federation, read its history and privacy ledger, ask devices for top-k "
                    "recommendations (computed on the device), and operate it. Errors are "
                    "application/problem+json (RFC 9457).")
    app.state.services = services  # what admin.deps.get_services hands the routes
    install(app)
    app.add_middleware(MetricsMiddleware, metrics=services.metrics)
    # The order is the OpenAPI document's path order and the order routes are
    # matched in: /v1/rounds/current (federation) before /v1/rounds/{number}.
    routers = [health.router, dashboard.router, meta.router, federation.router(settings),
               model_versions.router(settings), ledger.router(settings), events.router, recommendations.router(settings),
               actions.router]
    for r in routers:
        app.include_router(r)
    # Added last, so outermost: sizes, concurrency and time are checked before anything reads the request.
    # It matches the routes as the routers declare them (each router's own routes, in the same order).
    app.add_middleware(RequestGate, limits=settings.limits, routes=lambda: [x for r in routers for x in r.routes],
                       retry_after_s=settings.retry_after_s, log=services.refusal_log,
                       on_refused=lambda reason: services.metrics.refused.labels(reason).inc())
    return app
