"""Schema-driven fuzzing of the admin service (schemathesis): requests built
from the OpenAPI document the service itself serves, sent to the running
service (uvicorn, a filled SQLite store, the in-process CoordinatorAdmin
gRPC server); every answer must be no 5xx and conform to the document
(status code, content type, headers, body schema), with the operator token
and without. /v1/events is left out: a Server-Sent-Events stream never
ends, which a request-response fuzzer cannot read (test_admin_api.py
checks it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from admin_harness import World, database, headers, world
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from admin.settings import Role


@pytest.fixture(scope="module")
def fuzz_world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp: Path = tmp_path_factory.mktemp("admin-fuzz")
    # every hosted device answers here: a 503/504 would then be a fault, not the scripted answer
    with database("sqlite", tmp, request) as url, world("sqlite", url, scripted_failures=False) as running:
        yield running


def _document() -> dict[str, Any]:
    """The OpenAPI document of an admin app (static: it does not depend on
    the store or the coordinator; the served one is checked equal below)."""
    from admin.app import create_app
    from admin.settings import AdminSettings
    from coordinator.store import InMemoryStore

    return create_app(AdminSettings(), store=InMemoryStore()).openapi()


DOCUMENT = _document()
#: One HTTP session for every generated request (keep-alive).
SESSION = requests.Session()
schema = schemathesis.openapi.from_dict(DOCUMENT).exclude(path="/v1/events")


def test_the_served_document_is_the_fuzzed_one(fuzz_world: World) -> None:
    served = httpx.get(fuzz_world.base + "/openapi.json", headers=headers(Role.VIEWER)).json()
    assert served == DOCUMENT


@schema.parametrize()
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_5xx_and_every_answer_conforms_to_the_openapi_document(case: Any, fuzz_world: World) -> None:
    # A top-k request's k is valid up to the MODEL's item count, which only the
    # device knows (the document says so; k > items is a 422): there the
    # "schema-valid request accepted" check cannot apply. Every other check does.
    excluded = [positive_data_acceptance] if case.operation.path.endswith("/recommendations") else []
    # Every request carries the operator's token, except a case schemathesis built by leaving out the
    # credential its security scheme requires: with the token added that request would be valid, and its
    # 200 a false "schema-violating request accepted". Sent as built, it must be refused (401).
    negated = case.operation.schema.is_security_param_negated(case)
    auth = {} if negated else headers(Role.OPERATOR)
    case.call_and_validate(base_url=fuzz_world.base, session=SESSION, headers=auth, excluded_checks=excluded)
