"""The privacy ledger and the operator audit log, read from the
coordinator's store (viewer)."""

from typing import Annotated

from fastapi import APIRouter

from admin import history, schemas
from admin.deps import LISTING_ERRORS, STORE_ERRORS, Reader, ServicesDep, cursor_q, page_size
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
    limit_q = page_size(settings)

    async def audit(_: Reader, services: ServicesDep, limit: Annotated[int | None, limit_q] = None,
                    cursor: Annotated[str | None, cursor_q("audit")] = None) -> schemas.AuditPage:
        """The operator audit log (who did what, when, how it ended), newest first."""
        return await services.read_page(lambda n, c: history.list_audit(services.store, limit=n, cursor=c),
                                        limit, cursor)

    routes = APIRouter()
    routes.add_api_route("/v1/privacy", privacy, response_model=schemas.Privacy, tags=["privacy"],
                         responses=STORE_ERRORS)
    routes.add_api_route("/v1/audit", audit, response_model=schemas.AuditPage, tags=["operator"],
                         responses=LISTING_ERRORS)
    return routes
