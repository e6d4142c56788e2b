"""What the admin routes depend on: the services of an app, the role guards
and the parameter guards (no routes here; admin/routes/ has them).

One `Services` per app, built by `build_services` and kept in
`app.state.services`; a route reaches it through the `ServicesDep`
dependency, so the routers hold no state of their own and one process may
serve several apps (the tests do).

Role guards (D45): `Reader` admits viewer and operator tokens, `Recommender`
recommender and operator tokens, `Operator` operator tokens only and
`AnyRole` every role. No token or an unknown one is a 401 with
`WWW-Authenticate`; a role the route does not admit is a 403.
"""

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request, Security
from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer
from starlette.concurrency import run_in_threadpool

from admin import history, live_views
from admin.auth import ANY, OPERATE, READ, TOP_K, Forbidden, Principal, TokenTable, Unauthenticated
from admin.live import LiveError, LiveLink
from admin.live_cache import LiveStateCache
from admin.metrics import AdminMetrics
from admin.problems import InvalidParam, ProblemError, problem_responses
from admin.refusal_audit import RefusalAudit
from admin.refusal_log import RefusalLog
from admin.settings import AdminSettings, Role
from admin.stream_slots import StreamSlots
from admin.topk_routing import TopKRouter
from coordinator.store import Store, StoreError

_log = logging.getLogger("fedmask.admin")
T = TypeVar("T")
_bearer = HTTPBearer(auto_error=False, description="An API token (`fedmask admin-token`): viewer, recommender or "
                                                   "operator")


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
    #: who holds the /v1/events streams (D82)
    stream_slots: StreamSlots
    #: refused operator actions, to the coordinator's audit log (D82)
    refusal_audit: RefusalAudit
    #: the admin listener of the replica holding a device's stream (D111)
    topk_router: TopKRouter
    #: log lines of refusals, rate-limited (D82)
    refusal_log: RefusalLog

    async def read(self, fn: Callable[[], T]) -> T:
        """Run a blocking store read in a worker thread; StoreError -> 503."""
        try:
            return await run_in_threadpool(fn)
        except StoreError as exc:
            _log.warning("store read failed: %s", exc)
            raise ProblemError(503, "the coordinator's store is not reachable",
                               headers={"Retry-After": str(self.settings.retry_after_s)}) from None

    async def read_page(self, read: Callable[[int, str | None], T], limit: int | None, cursor: str | None) -> T:
        """A page of a listing: `read(n, cursor)` as `read` does it, n being
        `limit` or else the settings' page_size; a cursor that does not
        decode (history.BadCursor) -> 422 naming `query.cursor`."""
        n = limit or self.settings.page_size
        try:
            return await self.read(lambda: read(n, cursor))
        except history.BadCursor as exc:
            raise cursor_problem(exc) from None

    async def live_call(self, call: Awaitable[T], *, what: str) -> T:
        """Await a call to the coordinator's admin listener; LiveError -> its problem document."""
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


def build_services(settings: AdminSettings, *, store: Store | None = None, live: LiveLink | None = None) -> Services:
    """An app's services; `store` and `live` default to the ones the settings name."""
    link = live or LiveLink(settings.coordinator)
    store = store or open_store_read_only(settings.database_url)
    return Services(settings=settings, store=store, live=link, tokens=TokenTable(settings.tokens),
                    metrics=AdminMetrics(), rounds=history.RoundCounter(),
                    live_state=LiveStateCache(link.live_state,
                                              max_age_s=settings.coordinator.live_state_max_age_s,
                                              stale_s=settings.coordinator.live_state_stale_s),
                    stream_slots=StreamSlots(settings.event_streams),
                    refusal_audit=RefusalAudit(link.record_refusal,
                                               per_minute=settings.limits.refusal_audits_per_minute),
                    topk_router=TopKRouter(store, link, settings.coordinator),
                    refusal_log=RefusalLog())


def get_services(request: Request) -> Services:
    """The services of the app serving `request` (set by `admin.app.create_app`)."""
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


# ------------------------------------------------------------------ roles
def _guard(roles: frozenset[Role]) -> Any:
    """A dependency: the request's principal if its token's role is in `roles`.
    Every refusal is logged (rate-limited); a 403 on an operator route is
    also audited (RefusalAudit), by the route's name as the action."""
    async def check(request: Request, _: Any = Security(_bearer)) -> Principal:
        services = get_services(request)
        try:
            return services.tokens.authorize(request.headers.get("authorization"), roles)
        except Unauthenticated as exc:
            services.refusal_log("401", f"{request.method} {request.url.path[:100]}: {exc}")
            raise ProblemError(401, str(exc), headers={"WWW-Authenticate": 'Bearer realm="fedmask"'}) from None
        except Forbidden as exc:
            who = exc.principal
            services.refusal_log("403", f"{request.method} {request.url.path[:100]} by {who.name}: {exc}")
            route = request.scope.get("route")
            if roles == OPERATE and isinstance(route, APIRoute):
                services.refusal_audit.refused(who, route.name, str(exc))
            raise ProblemError(403, str(exc)) from None
    return Depends(check)


Reader = Annotated[Principal, _guard(READ)]
Recommender = Annotated[Principal, _guard(TOP_K)]
Operator = Annotated[Principal, _guard(OPERATE)]
AnyRole = Annotated[Principal, _guard(ANY)]

#: OpenAPI `responses=` of the errors a guarded route may answer.
AUTH_ERRORS = problem_responses(401, 403)
STORE_ERRORS = problem_responses(401, 403, 503)
#: ... of a listing (a bad `limit` or `cursor` is a 422).
LISTING_ERRORS = problem_responses(401, 403, 422, 503)
LIVE_ERRORS = problem_responses(401, 403, 502, 503)


# ------------------------------------------------------------- parameters
async def reject_unknown_query_parameters(request: Request) -> None:
    """A query parameter the route does not take is a 422 (a typo such as
    `?limt=5` never passes silently). The app's dependency: every route has it."""
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


def page_size(settings: AdminSettings) -> Any:
    """The `limit` of a listing: 1 to `settings.max_page_size` (the OpenAPI
    document states that bound, so the routers that take it are built per app)."""
    return Query(ge=1, le=settings.max_page_size, description="Items per page")


def cursor_q(kind: str) -> Any:
    """The `cursor` of a listing of `kind` (admin/history.py's cursor pattern)."""
    return Query(pattern=history.cursor_pattern(kind), description="The next_cursor of the previous page")


def add_listing(routes: APIRouter, settings: AdminSettings, *, path: str, name: str, description: str, kind: str,
                read: Callable[[Store, int, str | None], Any], response_model: Any, tags: list[str | Enum]) -> None:
    """Add a paged listing to `routes`: GET `path` with `limit` (1 to
    `settings.max_page_size`) and `cursor` (a next_cursor of `kind`), whose
    page is `read(store, n, cursor)` run as `Services.read_page` runs it.
    `name` and `description` are the operation's, as an endpoint function
    of that name and docstring would give them."""
    limit_q = page_size(settings)

    async def listing(_: Reader, services: ServicesDep, limit: Annotated[int | None, limit_q] = None,
                      cursor: Annotated[str | None, cursor_q(kind)] = None) -> Any:
        return await services.read_page(lambda n, c: read(services.store, n, c), limit, cursor)

    routes.add_api_route(path, listing, response_model=response_model, tags=tags, responses=LISTING_ERRORS,
                         name=name, description=description)


def cursor_problem(exc: history.BadCursor) -> ProblemError:
    """A cursor that does not decode: 422 naming `query.cursor`."""
    return ProblemError(422, str(exc), invalid_params=[InvalidParam(name="query.cursor", reason=str(exc))])


def k_q(settings: AdminSettings) -> Any:
    """The `k` of a top-k request: 1 to `settings.max_top_k` (D84; the
    OpenAPI document states the bound, so the router is built per app)."""
    return Query(ge=1, le=settings.max_top_k,
                 description=f"How many items, at most {settings.max_top_k} (and the model's items); the device "
                             "may answer fewer (its own cap, or the user has seen the rest)")


#: The `exclude_seen` of a top-k request: a wish the device's policy decides on (D84).
seen_q = Query(description="Leave out the items the user already interacted with. The device decides: where its "
                           "policy does not let a caller ask for seen items, false is ignored, and the answer's "
                           "`seen_excluded` says what the device did")
