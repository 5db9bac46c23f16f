"""schemathesis against the served OpenAPI schema, every operation, authenticated as a
tenant, bounded (25 examples per operation): every built-in check — no 5xx; status codes,
content types, headers and bodies as documented; schema-violating requests refused and
schema-valid ones accepted; a request without the key refused; unsupported methods
answered 405 — except where a check cannot apply, each for a precise reason
(`excluded_checks` below)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings

from apps.schedules.tests.factories import make_schedule
from apps.tenants.services import api_key_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def api_schema(db: Any) -> Iterator[Any]:
    # As Django's test client does: keep the test's connection (and its transaction) open
    # across in-process WSGI requests.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        schema = schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application())
        yield schema
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@pytest.fixture
def auth(tenant_a: Any) -> dict[str, str]:
    tenant_a.api_rate_per_min = 1_000_000
    tenant_a.save(update_fields=["api_rate_per_min"])
    make_schedule(tenant_a)  # something to list
    _, raw = api_key_create(actor="test", tenant=tenant_a, name="fuzz")
    return {"Authorization": f"Bearer {raw}"}


schema = schemathesis.pytest.from_fixture("api_schema")

# The bodies whose validity JSON Schema cannot state: a cron expression that parses and
# fires, an IANA zone that exists, end_at after start_at, a one-shot not in the past, a
# payload that suits its handler (docs/api.md). A schema-valid body is rightly refused
# there, so `positive_data_acceptance` does not apply; every other check does.
CROSS_FIELD_BODIES = {
    ("POST", "/api/v1/schedules"),
    ("PATCH", "/api/v1/schedules/{schedule_id}"),
    ("POST", "/api/v1/schedules/preview"),
    # An alert channel's target must suit its kind (an e-mail address, or a URL the SSRF
    # guard admits); a rule names an existing channel and schedule, and only lag rules take
    # a threshold and a window (docs/alerts.md).
    ("POST", "/api/v1/alert-channels"),
    ("PATCH", "/api/v1/alert-channels/{channel_id}"),
    ("POST", "/api/v1/alert-rules"),
    ("PATCH", "/api/v1/alert-rules/{rule_id}"),
    # A bulk change names its schedules by `ids` or by `filter`, never both (docs/api.md).
    ("POST", "/api/v1/schedules/bulk"),
}


def _unlisted_fields(case: Any) -> bool:
    """The body names a field its schema does not list. Every request serializer refuses an
    unknown field (a typo must not be silently ignored: docs/api.md), which this OpenAPI 3.0
    schema does not state (no `additionalProperties: false`)."""
    if not isinstance(case.body, dict):
        return False
    listed: set[str] = set()
    for body in case.operation.body:
        listed |= set((body.definition.get("schema") or {}).get("properties") or {})
    return bool(listed) and bool(set(case.body) - listed)


def excluded_checks(case: Any) -> list[Any]:
    excluded = []
    # A page cursor is an opaque token only the server issues: any string is schema-valid,
    # and a forged one is rightly a 400 (apps/core/pagination.py).
    forged_cursor = bool((case.query or {}).get("cursor"))
    # A NUL character is refused in every JSON string, wherever the schema allows a string
    # (tickweb/parsers.py: PostgreSQL cannot store it in text or jsonb).
    nul_in_body = (
        "\\u0000" in json.dumps(case.body) if isinstance(case.body, dict | list) else False
    )
    # An Idempotency-Key is 1-255 printable ASCII characters (its description); OpenAPI 3.0
    # cannot constrain a generated header value, so a generated key may be rightly refused.
    generated_key = "Idempotency-Key" in (case.headers or {})
    # A `label` filter is `key=value` under the label rules (docs/api.md), beyond what the
    # schema's string states; a generated one may be rightly refused.
    label_filter = "label" in (case.query or {})
    if (
        (case.method.upper(), case.path) in CROSS_FIELD_BODIES
        or forged_cursor
        or nul_in_body
        or generated_key
        or label_filter
        or _unlisted_fields(case)
    ):
        excluded.append(schemathesis.checks.positive_data_acceptance)
    # An empty query value means the parameter is absent (`?state=` = no state filter: the
    # query string is read as HTML-form input, as the web UI's GET forms send it), which
    # OpenAPI 3.0 cannot say next to an enum or a format. Only for such a case is
    # `negative_data_rejection` skipped.
    if any(value in ("", [""]) for value in (case.query or {}).values()):
        excluded.append(schemathesis.checks.negative_data_rejection)
    return excluded


@schema.parametrize()
@settings(
    max_examples=25,
    # The same examples every run: a new finding comes from a change, never from a lucky
    # seed on someone else's commit. To hunt, run it by hand with derandomize off and more examples.
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                           HealthCheck.filter_too_much],
)  # fmt: skip
def test_api_honours_its_schema(case: Any, auth: dict[str, str]) -> None:
    response = case.call(headers=auth)
    assert response.status_code < 500, (case.method, case.path, response.text[:500])
    case.validate_response(response, headers=auth, excluded_checks=excluded_checks(case))
