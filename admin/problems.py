"""Errors as RFC 9457 problem documents (`application/problem+json`).

Every error the service returns, its own and FastAPI's / Starlette's (404 of
an unknown path, 405, 422 of a bad parameter or body, 500 of a bug), goes
through `install(app)`'s handlers, so a client parses one shape. `detail`
never contains a token or private device data; a 500 says only that it was
an internal error (the traceback goes to the log).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

PROBLEM_JSON = "application/problem+json"
_log = logging.getLogger("fedmask.admin")


class InvalidParam(BaseModel):
    """One rejected input: where it was and why."""

    name: str
    reason: str


class Problem(BaseModel):
    """An RFC 9457 problem document."""

    type: str = Field("about:blank", description="URI naming the kind of problem")
    title: str = Field(description="Short summary of the kind of problem (the HTTP reason phrase by default)")
    status: int = Field(description="HTTP status code")
    detail: str | None = Field(None, description="What went wrong with this request")
    instance: str | None = Field(None, description="The request path")
    invalid_params: list[InvalidParam] | None = Field(None, description="Rejected inputs (422)")


class ProblemError(Exception):
    """Raise to answer with a problem document."""

    def __init__(self, status: int, detail: str, *, title: str | None = None, type_: str = "about:blank",
                 headers: Mapping[str, str] | None = None,
                 invalid_params: Sequence[InvalidParam] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.title = title or HTTPStatus(status).phrase
        self.type = type_
        self.headers = dict(headers or {})
        self.invalid_params = list(invalid_params) if invalid_params else None


def problem_response(request: Request, status: int, detail: str | None, *, title: str | None = None,
                     type_: str = "about:blank", headers: Mapping[str, str] | None = None,
                     invalid_params: Sequence[InvalidParam] | None = None) -> JSONResponse:
    body = Problem(type=type_, title=title or HTTPStatus(status).phrase, status=status, detail=detail,
                   instance=request.url.path, invalid_params=list(invalid_params) if invalid_params else None)
    return JSONResponse(body.model_dump(exclude_none=True), status_code=status, headers=dict(headers or {}),
                        media_type=PROBLEM_JSON)


def _location(loc: Sequence[Any]) -> str:
    return ".".join(str(p) for p in loc)


def install(app: FastAPI) -> None:
    """Route every error of `app` through a problem document."""

    async def on_problem(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ProblemError)
        return problem_response(request, exc.status, exc.detail, title=exc.title, type_=exc.type,
                                headers=exc.headers, invalid_params=exc.invalid_params)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        detail = exc.detail if isinstance(exc.detail, str) else None
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no route {request.url.path}"
        return problem_response(request, exc.status_code, detail, headers=exc.headers)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        params = [InvalidParam(name=_location(e.get("loc", ())), reason=str(e.get("msg", "invalid")))
                  for e in exc.errors()]
        return problem_response(request, 422, "the request's parameters or body are invalid",
                                invalid_params=params)

    async def on_bug(request: Request, exc: Exception) -> JSONResponse:
        _log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem_response(request, 500, "internal error (see the admin service's log)")

    app.add_exception_handler(ProblemError, on_problem)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(Exception, on_bug)


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries for the given error statuses."""
    return {s: {"model": Problem, "description": HTTPStatus(s).phrase,
                "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}}
            for s in statuses}
