"""The dashboard (open): its page and static files hold no data; the page
asks for a token and uses the REST API. Not part of the OpenAPI document."""

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from admin.problems import ProblemError

#: What /static/{name} serves, with its media type; any other name is a 404.
_STATIC = {"dashboard.js": "text/javascript; charset=utf-8", "dashboard.css": "text/css; charset=utf-8"}
_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")

router = APIRouter()


@router.get("/", include_in_schema=False)
async def dashboard() -> HTMLResponse:
    page = resources.files("admin").joinpath("static", "dashboard.html").read_text(encoding="utf-8")
    return HTMLResponse(page, headers={"Content-Security-Policy": _CSP, "Cache-Control": "no-store"})


@router.get("/static/{name}", include_in_schema=False)
async def static(name: str) -> Response:
    if name not in _STATIC:
        raise ProblemError(404, f"no static file {name!r}")
    body = resources.files("admin").joinpath("static", name).read_bytes()
    return Response(body, media_type=_STATIC[name], headers={"Cache-Control": "no-cache"})
