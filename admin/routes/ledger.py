"""The privacy ledger and the operator audit log, read from the
coordinator's store (viewer)."""

from fastapi import APIRouter

from admin import history, schemas
from admin.deps import STORE_ERRORS, Reader, ServicesDep, add_listing
from admin.live import LiveError
from admin.settings import AdminSettings


async def privacy(_: Reader, services: ServicesDep) -> schemas.Privacy:
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


def router(settings: AdminSettings) -> APIRouter:
    """The routes, `/v1/audit`'s `limit` bounded by `settings.max_page_size`."""
    routes = APIRouter()
    routes.add_api_route("/v1/privacy", privacy, response_model=schemas.Privacy, tags=["privacy"],
                         responses=STORE_ERRORS)
    add_listing(routes, settings, path="/v1/audit", name="audit", kind="audit",
                description="The operator audit log (who did what, when, how it ended), newest first.",
                read=lambda store, n, c: history.list_audit(store, limit=n, cursor=c),
                response_model=schemas.AuditPage, tags=["operator"])
    return routes
