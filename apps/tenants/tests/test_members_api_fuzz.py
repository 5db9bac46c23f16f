"""schemathesis against the served schema of the account routes (members, invitations),
bounded: no 5xx, and status codes, content types and bodies as documented."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings

from apps.tenants.members import invitation_create
from apps.tenants.models import Membership
from apps.tenants.services import api_key_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def api_schema(db: Any) -> Iterator[Any]:
    # As Django's test client does: keep the test's connection (and its transaction) open
    # across in-process WSGI requests.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application())
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@pytest.fixture
def auth(tenant_a: Any, alice: Any, bob: Any) -> dict[str, str]:
    tenant_a.api_rate_per_min = 1_000_000
    tenant_a.save(update_fields=["api_rate_per_min"])
    invitation_create(
        tenant=tenant_a, email="fuzz@example.com", role=Membership.Role.VIEWER, actor="t",
        site_url="http://testserver/",
    )  # fmt: skip
    _, raw = api_key_create(actor="test", tenant=tenant_a, name="fuzz")
    return {"Authorization": f"Bearer {raw}"}


schema = schemathesis.pytest.from_fixture("api_schema").include(
    path_regex=r"^/api/v1/(members|invitations)"
)


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                           HealthCheck.filter_too_much],
)  # fmt: skip
def test_account_api_honours_its_schema(case: Any, auth: dict[str, str]) -> None:
    response = case.call(headers=auth)
    assert response.status_code < 500, (case.method, case.path, response.text[:500])
    case.validate_response(
        response,
        checks=[
            schemathesis.checks.not_a_server_error,
            schemathesis.checks.status_code_conformance,
            schemathesis.checks.content_type_conformance,
            schemathesis.checks.response_schema_conformance,
        ],
    )
