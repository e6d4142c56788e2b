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
"""


import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Annotated, Any, TypeVar

from fastapi import Body, Depends, FastAPI, Path, Query, Request, Security
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from admin import history, live_views, schemas
from admin.auth import ANY, OPERATE, READ, TOP_K, Forbidden, Principal, TokenTable, Unauthenticated
from admin.live import LiveError, LiveLink
from admin.live_cache import LiveStateCache
from admin.metrics import AdminMetrics, MetricsMiddleware
from admin.problems import InvalidParam, ProblemError, install, problem_responses
from admin.settings import AdminSettings, Role
from coordinator.store import Store, StoreError
from fedmask_proto.v1 import admin_service_pb2 as pb

_log = logging.getLogger("fedmask.admin")
T = TypeVar("T")
#: Largest k a top-k request may ask for (the device checks k <= its items).
MAX_K = 10_000
_bearer = HTTPBearer(auto_error=False, description="An API token (`fedmask admin-token`): viewer, recommender or "
                                                   "operator")
_STATIC = {"dashboard.js": "text/javascript; charset=utf-8", "dashboard.css": "text/css; charset=utf-8"}
_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")


@dataclass
class Services:
    """What the routes use; one per app."""

    settings: AdminSettings
    store: Store
    live: LiveLink
    tokens: TokenTable
    metrics: AdminMetrics
    rounds: history.RoundCounter
    #: the live state for status reads (D58); /readyz and actions call the coordinator directly
    live_state: LiveStateCache

    async def read(self, fn: Callable[[], T]) -> T:
        """Run a blocking store read in a worker thread; StoreError -> 503."""
        try:
            return await run_in_threadpool(fn)
        except StoreError as exc:
            _log.warning("store read failed: %s", exc)
            raise ProblemError(503, "the coordinator's store is not reachable",
                               headers={"Retry-After": str(self.settings.retry_after_s)}) from None

    async def live_call(self, call: Awaitable[T], *, what: str) -> T:
        try:
            return await call
        except LiveError as exc:
            raise live_views.problem_for(exc, what=what, retry_after_s=self.settings.retry_after_s) from None


def open_store_read_only(url: str) -> Store:
    """The coordinator's store, without migrating it (the coordinator owns the
    schema). A SQLite file must exist already (never created here)."""
    from pathlib import Path as FsPath

    from coordinator.store import open_store
    from coordinator.store.engine import normalize_url

    if url != "memory://":
        parsed = normalize_url(url)
        if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
            if not FsPath(parsed.database).expanduser().is_file():
                raise StoreError(f"no store at {parsed.database} (start the coordinator first)")
    return open_store(url, migrate=False)


async def _reject_unknown_query_parameters(request: Request) -> None:
    """A query parameter the route does not take is a 422 (a typo such as
    `?limt=5` never passes silently)."""
    from fastapi.routing import APIRoute

    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    known: set[str] = set()
    pending = [route.dependant]
    while pending:
        dependant = pending.pop()
        known.update(p.alias for p in dependant.query_params)
        pending.extend(dependant.dependencies)
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        raise ProblemError(422, f"unknown query parameter(s): {', '.join(repr(u[:40]) for u in unknown[:10])}",
                           invalid_params=[InvalidParam(name=f"query.{u[:40]}", reason="not a parameter of this route")
                                           for u in unknown[:10]])


def create_app(settings: AdminSettings, *, store: Store | None = None, live: LiveLink | None = None) -> FastAPI:
    """The app; `store` and `live` default to the ones the settings name."""
    link = live or LiveLink(settings.coordinator)
    services = Services(settings=settings, store=store or open_store_read_only(settings.database_url),
                        live=link, tokens=TokenTable(settings.tokens),
                        metrics=AdminMetrics(), rounds=history.RoundCounter(),
                        live_state=LiveStateCache(link.live_state,
                                                  max_age_s=settings.coordinator.live_state_max_age_s,
                                                  stale_s=settings.coordinator.live_state_stale_s))

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await services.live.close()
        await run_in_threadpool(services.store.close)

    app = FastAPI(
        title="fedmask admin", version="1", lifespan=lifespan,
        dependencies=[Depends(_reject_unknown_query_parameters)], docs_url=None, redoc_url=None, openapi_url=None,
        description="Watch the federation, read its history and privacy ledger, ask devices for top-k "
                    "recommendations (computed on the device), and operate it. Errors are "
                    "application/problem+json (RFC 9457).")
    app.state.services = services
    install(app)
    app.add_middleware(MetricsMiddleware, metrics=services.metrics)

    def guard(roles: frozenset[Role]) -> Any:
        async def check(request: Request, _: Any = Security(_bearer)) -> Principal:
            try:
                return services.tokens.authorize(request.headers.get("authorization"), roles)
            except Unauthenticated as exc:
                raise ProblemError(401, str(exc), headers={"WWW-Authenticate": 'Bearer realm="fedmask"'}) from None
            except Forbidden as exc:
                raise ProblemError(403, str(exc)) from None
        return Depends(check)

    reader = Annotated[Principal, guard(READ)]
    recommender = Annotated[Principal, guard(TOP_K)]
    operator = Annotated[Principal, guard(OPERATE)]
    auth_errors = problem_responses(401, 403)
    store_errors = problem_responses(401, 403, 503)
    live_errors = problem_responses(401, 403, 502, 503)

    # ------------------------------------------------------------- open
    @app.get("/healthz", response_model=schemas.Health, tags=["health"])
    async def healthz() -> schemas.Health:
        """The process is alive (no dependency is checked)."""
        return schemas.Health()

    @app.get("/readyz", response_model=schemas.Readiness, tags=["health"],
             responses={503: {"model": schemas.Readiness, "description": "Not ready"}})
    async def readyz() -> JSONResponse:
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

    @app.get("/", include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        page = resources.files("admin").joinpath("static", "dashboard.html").read_text(encoding="utf-8")
        return HTMLResponse(page, headers={"Content-Security-Policy": _CSP, "Cache-Control": "no-store"})

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        if name not in _STATIC:
            raise ProblemError(404, f"no static file {name!r}")
        body = resources.files("admin").joinpath("static", name).read_bytes()
        return Response(body, media_type=_STATIC[name], headers={"Cache-Control": "no-cache"})

    @app.get("/metrics", tags=["health"], response_class=Response,
             responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
                              "description": "Prometheus text format"}, **auth_errors})
    async def metrics(_: reader) -> Response:
        """Prometheus metrics of this admin process (the coordinator has its own)."""
        return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(_: Annotated[Principal, guard(ANY)]) -> JSONResponse:
        return JSONResponse(app.openapi())

    # ------------------------------------------------------------- history
    @app.get("/v1/federation", response_model=schemas.Federation, tags=["federation"], responses=store_errors)
    async def federation(_: reader) -> schemas.Federation:
        """The model, its current version, rounds by outcome, devices, and the live phase."""
        def read() -> tuple[dict[schemas.Outcome, int], Any, int, int]:
            latest = services.store.list_model_versions(limit=1).items
            devices = services.store.list_devices()
            revoked = sum(1 for d in devices if d.status.value == "revoked")
            return services.rounds.counts(services.store), latest[0] if latest else None, len(devices), revoked

        counts, latest, enrolled, revoked = await services.read(read)
        spent = await services.read(lambda: services.store.privacy_summary().cumulative_epsilon)
        state: pb.LiveState | None
        try:
            state = await services.live_state.get()
        except LiveError:
            state = None
        return schemas.Federation(
            model_name=latest.model_name if latest is not None else None,
            current_version=state.model_version if state is not None else (latest.id if latest else None),
            rounds_committed=counts["committed"], rounds_aborted=counts["aborted"], rounds_running=counts["running"],
            devices_enrolled=enrolled, devices_revoked=revoked,
            devices_connected=state.devices.connected if state is not None else None,
            phase=live_views.phase(state) if state is not None else None, coordinator_reachable=state is not None,
            epsilon_spent=spent,
            epsilon_budget=(state.privacy.epsilon_budget or None) if state is not None else None)

    page_size = Query(ge=1, le=settings.max_page_size, description="Items per page")
    def cursor_q(kind: str) -> Any:
        return Query(pattern=history.cursor_pattern(kind), description="The next_cursor of the previous page")

    def cursor_problem(exc: history.BadCursor) -> ProblemError:
        return ProblemError(422, str(exc), invalid_params=[InvalidParam(name="query.cursor", reason=str(exc))])

    @app.get("/v1/rounds", response_model=schemas.RoundPage, tags=["rounds"], responses=problem_responses(401, 403, 422, 503))
    async def rounds(_: reader, limit: Annotated[int | None, page_size] = None,
                     cursor: Annotated[str | None, cursor_q("rounds")] = None,
                     outcome: Annotated[schemas.Outcome | None, Query(description="Only rounds of this outcome")] = None,
                     ) -> schemas.RoundPage:
        """Rounds, newest first. A filtered page may hold fewer than `limit` rounds and still have a cursor."""
        n = limit or settings.page_size
        try:
            return await services.read(lambda: history.list_rounds(services.store, limit=n, cursor=cursor,
                                                                   outcome=outcome))
        except history.BadCursor as exc:
            raise cursor_problem(exc) from None

    @app.get("/v1/rounds/current", response_model=schemas.CurrentRound, tags=["rounds"], responses=live_errors)
    async def round_current(_: reader) -> schemas.CurrentRound:
        """The running round from the coordinator: stage, survivors per stage against the threshold."""
        return live_views.current_round(await services.live_call(services.live_state.get(), what="live state"))

    @app.get("/v1/rounds/{number}", response_model=schemas.RoundDetail, tags=["rounds"],
             responses=problem_responses(401, 403, 404, 422, 503))
    async def round_detail(_: reader, number: Annotated[int, Path(ge=1, le=2**62)]) -> schemas.RoundDetail:
        """One round: cohort, threshold, survivors and dropouts per stage, time per stage, outcome, metrics, epsilon."""
        found = await services.read(lambda: history.get_round(services.store, number))
        if found is None:
            raise ProblemError(404, f"no round {number}")
        return found

    # -------------------------------------------------------------- models
    @app.get("/v1/models", response_model=schemas.ModelPage, tags=["models"],
             responses=problem_responses(401, 403, 422, 503))
    async def models(_: reader, limit: Annotated[int | None, page_size] = None,
                     cursor: Annotated[str | None, cursor_q("models")] = None) -> schemas.ModelPage:
        """Model versions, newest first, with lineage."""
        n = limit or settings.page_size
        try:
            return await services.read(lambda: history.list_models(services.store, limit=n, cursor=cursor))
        except history.BadCursor as exc:
            raise cursor_problem(exc) from None

    @app.get("/v1/models/{version}", response_model=schemas.ModelDetail, tags=["models"],
             responses=problem_responses(401, 403, 404, 422, 503))
    async def model(request: Request, _: reader,
                    version: Annotated[int, Path(ge=1, le=2**62)]) -> schemas.ModelDetail:
        """One model version: lineage (parent version, round) and where to download its parameters."""
        url = str(request.url_for("model_parameters", version=version).path)
        found = await services.read(lambda: history.get_model(services.store, version, parameters_url=url))
        if found is None:
            raise ProblemError(404, f"no model version {version}")
        return found

    @app.get("/v1/models/{version}/parameters", tags=["models"], response_class=Response, name="model_parameters",
             responses={200: {"content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                   "format": "binary"}}},
                              "description": "The public global parameters as .npz (numpy, no pickles)"},
                        **problem_responses(401, 403, 404, 422, 503)})
    async def model_parameters(_: reader, version: Annotated[int, Path(ge=1, le=2**62)]) -> Response:
        """Download a version's global parameters (.npz; the sha256 is the ETag)."""
        found = await services.read(lambda: history.model_parameters(services.store, version))
        if found is None:
            raise ProblemError(404, f"no model version {version}")
        blob, sha = found
        return Response(blob, media_type="application/octet-stream",
                        headers={"Content-Disposition": f'attachment; filename="fedmask-model-v{version}.npz"',
                                 "ETag": f'"{sha}"'})

    # ------------------------------------------------------------- privacy
    @app.get("/v1/privacy", response_model=schemas.Privacy, tags=["privacy"], responses=store_errors)
    async def privacy(_: reader) -> schemas.Privacy:
        """The privacy ledger per round and the epsilon budget."""
        budget: float | None = None
        exhausted: bool | None = None
        try:
            state = await services.live.live_state()
            budget = state.privacy.epsilon_budget or None
            exhausted = state.privacy.exhausted
        except LiveError:
            pass
        return await services.read(lambda: history.privacy(services.store, budget=budget, exhausted=exhausted))

    @app.get("/v1/audit", response_model=schemas.AuditPage, tags=["operator"],
             responses=problem_responses(401, 403, 422, 503))
    async def audit(_: reader, limit: Annotated[int | None, page_size] = None,
                    cursor: Annotated[str | None, cursor_q("audit")] = None) -> schemas.AuditPage:
        """The operator audit log (who did what, when, how it ended), newest first."""
        n = limit or settings.page_size
        try:
            return await services.read(lambda: history.list_audit(services.store, limit=n, cursor=cursor))
        except history.BadCursor as exc:
            raise cursor_problem(exc) from None

    # -------------------------------------------------------------- events
    @app.get("/v1/events", tags=["federation"], response_class=StreamingResponse,
             responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
                              "description": "Server-Sent Events: snapshot, stage, committed, aborted, devices, "
                                             "federation; `id` is the coordinator's sequence"}, **live_errors})
    async def events(_: reader) -> StreamingResponse:
        """Relay the coordinator's event stream (first a snapshot, then every change) as Server-Sent Events."""
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
                services.metrics.event_streams.dec()

        # the background task ends the relay also when the client left before the first frame was sent
        return StreamingResponse(frames(), media_type="text/event-stream", background=BackgroundTask(task.cancel),
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    # --------------------------------------------------------------- top-k
    k_q = Query(ge=1, le=MAX_K, description="How many items (at most the model's items)")
    seen_q = Query(description="Leave out the items the user already interacted with")
    topk_errors = problem_responses(401, 403, 404, 422, 502, 503, 504)

    async def top_k(**target: Any) -> schemas.Recommendations:
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

    @app.get("/v1/devices/{device_id}/recommendations", response_model=schemas.Recommendations,
             tags=["recommendations"], responses=topk_errors)
    async def device_recommendations(_: recommender, device_id: Annotated[int, Path(ge=1, le=2**63 - 1)],
                                     k: Annotated[int, k_q] = 10,
                                     exclude_seen: Annotated[bool, seen_q] = True) -> schemas.Recommendations:
        """Top-k computed on the device from its private model, relayed by the coordinator.
        404 unknown device, 503 not connected (Retry-After), 504 no answer in time, 403 the device refuses."""
        return await top_k(device_id=device_id, k=k, exclude_seen=exclude_seen)

    @app.get("/v1/users/{user}/recommendations", response_model=schemas.Recommendations, tags=["recommendations"],
             responses=topk_errors)
    async def user_recommendations(_: recommender, user: Annotated[str, Path(min_length=1, max_length=128)],
                                   k: Annotated[int, k_q] = 10,
                                   exclude_seen: Annotated[bool, seen_q] = True) -> schemas.Recommendations:
        """As for a device, by the user handle the device registered at enrolment."""
        return await top_k(user=user, k=k, exclude_seen=exclude_seen)

    # ------------------------------------------------------------- actions
    action_errors = problem_responses(400, 401, 403, 409, 422, 502, 503)
    body_t = Annotated[schemas.ActionBody | None, Body()]

    async def act(action: str, who: Principal, body: schemas.ActionBody | None,
                  version: int | None = None) -> schemas.ActionResult:
        reason = body.reason if body is not None else ""
        _log.info("operator action %s by %s", action, who.name)
        try:
            answer = await services.live_call(
                services.live.action(action, operator=who.name, reason=reason, version=version), what=action)
        finally:
            services.live_state.invalidate()  # the next status read sees the action (or its failure)
        return live_views.action_result(action, answer)

    @app.post("/v1/federation/pause", response_model=schemas.ActionResult, tags=["operator"], responses=action_errors)
    async def pause(who: operator, body: body_t = None) -> schemas.ActionResult:
        """No new round opens until resumed; a running round finishes. Audited."""
        return await act("pause", who, body)

    @app.post("/v1/federation/resume", response_model=schemas.ActionResult, tags=["operator"], responses=action_errors)
    async def resume(who: operator, body: body_t = None) -> schemas.ActionResult:
        """Rounds open again (unless the epsilon budget is exhausted). Audited."""
        return await act("resume", who, body)

    @app.post("/v1/rounds/current/abort", response_model=schemas.ActionResult, tags=["operator"],
              responses=action_errors)
    async def abort(who: operator, body: body_t = None) -> schemas.ActionResult:
        """Abort the running round (409 when none is running). Audited."""
        return await act("abort_round", who, body)

    @app.post("/v1/models/{version}/rollback", response_model=schemas.ActionResult, tags=["operator"],
              responses=problem_responses(400, 401, 403, 404, 409, 422, 502, 503))
    async def rollback(who: operator, version: Annotated[int, Path(ge=1, le=2**63 - 1)],
                       body: body_t = None) -> schemas.ActionResult:
        """Make an earlier version current again (stored as a new version). Audited."""
        return await act("rollback", who, body, version)

    return app
