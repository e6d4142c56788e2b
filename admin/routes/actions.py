"""Operator actions, carried out (and audited) by the coordinator: pause,
resume, abort the running round, roll back to an earlier model version.
Each route's name is its action's in the audit log (a refused call is
audited under it too, admin/refusal_audit.py)."""

import logging
from typing import Annotated

from fastapi import APIRouter, Body, Path

from admin import live_views, schemas
from admin.auth import Principal
from admin.deps import Operator, Services, ServicesDep
from admin.problems import problem_responses

_log = logging.getLogger("fedmask.admin")
router = APIRouter()
_ACTION_ERRORS = problem_responses(400, 401, 403, 409, 422, 502, 503)
ActionBodyParam = Annotated[schemas.ActionBody | None, Body()]


async def _act(services: Services, action: str, who: Principal, body: schemas.ActionBody | None,
               version: int | None = None) -> schemas.ActionResult:
    """Ask the coordinator to do `action` for operator `who`; the body's reason goes to the audit log."""
    reason = body.reason if body is not None else ""
    _log.info("operator action %s by %s", action, who.name)
    try:
        answer = await services.live_call(
            services.live.action(action, operator=who.name, reason=reason, version=version), what=action)
    finally:
        services.live_state.invalidate()  # the next status read sees the action (or its failure)
    return live_views.action_result(action, answer)


@router.post("/v1/federation/pause", response_model=schemas.ActionResult, tags=["operator"],
             responses=_ACTION_ERRORS)
async def pause(who: Operator, services: ServicesDep, body: ActionBodyParam = None) -> schemas.ActionResult:
    """No new round opens until resumed; a running round finishes. Audited."""
    return await _act(services, "pause", who, body)


@router.post("/v1/federation/resume", response_model=schemas.ActionResult, tags=["operator"],
             responses=_ACTION_ERRORS)
async def resume(who: Operator, services: ServicesDep, body: ActionBodyParam = None) -> schemas.ActionResult:
    """Rounds open again (unless the epsilon budget is exhausted). Audited."""
    return await _act(services, "resume", who, body)


@router.post("/v1/rounds/current/abort", response_model=schemas.ActionResult, tags=["operator"],
             responses=_ACTION_ERRORS, name="abort_round")
async def abort(who: Operator, services: ServicesDep, body: ActionBodyParam = None) -> schemas.ActionResult:
    """Abort the running round (409 when none is running). Audited."""
    return await _act(services, "abort_round", who, body)


@router.post("/v1/models/{version}/rollback", response_model=schemas.ActionResult, tags=["operator"],
             responses=problem_responses(400, 401, 403, 404, 409, 422, 502, 503))
async def rollback(who: Operator, services: ServicesDep, version: Annotated[int, Path(ge=1, le=2**63 - 1)],
                   body: ActionBodyParam = None) -> schemas.ActionResult:
    """Make an earlier version current again (stored as a new version). Audited."""
    return await _act(services, "rollback", who, body, version)

