"""Model versions from the coordinator's store: listing with lineage, one
version, and its public global parameters (viewer)."""

from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response

from admin import history, schemas
from admin.deps import Reader, ServicesDep, add_listing
from admin.problems import ProblemError, problem_responses
from admin.settings import AdminSettings


async def model(request: Request, _: Reader, services: ServicesDep,
                version: Annotated[int, Path(ge=1, le=2**62)]) -> schemas.ModelDetail:
    """One model version: lineage (parent version, round) and where to download its parameters."""
    url = str(request.url_for("model_parameters", version=version).path)
    found = await services.read(lambda: history.get_model(services.store, version, parameters_url=url))
    if found is None:
        raise ProblemError(404, f"no model version {version}")
    return found


async def model_parameters(_: Reader, services: ServicesDep,
                           version: Annotated[int, Path(ge=1, le=2**62)]) -> Response:
    """Download a version's global parameters (.npz; the sha256 is the ETag)."""
    found = await services.read(lambda: history.model_parameters(services.store, version))
    if found is None:
        raise ProblemError(404, f"no model version {version}")
    blob, sha = found
    return Response(blob, media_type="application/octet-stream",
                    headers={"Content-Disposition": f'attachment; filename="fedmask-model-v{version}.npz"',
                             "ETag": f'"{sha}"'})


def router(settings: AdminSettings) -> APIRouter:
    """The routes, `/v1/models`'s `limit` bounded by `settings.max_page_size`."""
    routes = APIRouter()
    add_listing(routes, settings, path="/v1/models", name="models", kind="models",
                description="Model versions, newest first, with lineage.",
                read=lambda store, n, c: history.list_models(store, limit=n, cursor=c),
                response_model=schemas.ModelPage, tags=["models"])
    routes.add_api_route("/v1/models/{version}", model, response_model=schemas.ModelDetail, tags=["models"],
                         responses=problem_responses(401, 403, 404, 422, 503))
    # `name` is what /v1/models/{version} links to (request.url_for)
    routes.add_api_route("/v1/models/{version}/parameters", model_parameters, tags=["models"],
                         response_class=Response, name="model_parameters",
                         responses={200: {"content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                               "format": "binary"}}},
                                          "description": "The public global parameters as .npz (numpy, no pickles)"},
                                    **problem_responses(401, 403, 404, 422, 503)})
    return routes
