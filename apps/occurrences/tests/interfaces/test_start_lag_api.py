"""Start lag through the API: `start_lag_s` on the occurrence list and detail is the first
attempt's started_at minus the lane's lag reference, read without a query per row."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.occurrences.models import Attempt, Lane, Occurrence
from apps.occurrences.tests.support.rows import attempt_started, occurrence, schedule

pytestmark = [pytest.mark.django_db, pytest.mark.clock_edge]


def _due(tenant, at, *, lane=Lane.STRICT, available_after_s=0):
    occ = occurrence(schedule(tenant), at)
    Occurrence.objects.filter(id=occ.id).update(
        lane=lane, available_at=at + timedelta(seconds=available_after_s)
    )
    return occ


def test_start_lag_is_the_first_attempts_start_against_the_lanes_reference(api_a, tenant_a):
    at = (timezone.now() - timedelta(minutes=10)).replace(microsecond=0)
    strict = _due(tenant_a, at)
    attempt_started(strict, at + timedelta(seconds=4.2), outcome=Attempt.Outcome.RETRY)
    attempt_started(strict, at + timedelta(minutes=5), attempt_no=2)  # a retry: not counted
    flexible = _due(tenant_a, at - timedelta(minutes=1), lane=Lane.FLEXIBLE, available_after_s=90)
    attempt_started(flexible, flexible.scheduled_for + timedelta(seconds=90.35))
    waiting = _due(tenant_a, at - timedelta(minutes=2))

    listed = api_a.get("/api/v1/occurrences").json()["results"]
    detail = api_a.get(f"/api/v1/occurrences/{strict.id}").json()

    assert {o["id"]: o["start_lag_s"] for o in listed} == {
        str(strict.id): 4.2, str(flexible.id): 0.35, str(waiting.id): None,
    }  # fmt: skip
    assert detail["start_lag_s"] == 4.2
    assert [a["attempt_no"] for a in detail["attempts"]] == [1, 2]


def test_the_start_lag_field_costs_no_query_per_row(api_a, tenant_a):
    at = (timezone.now() - timedelta(minutes=30)).replace(microsecond=0)
    attempt_started(_due(tenant_a, at), at + timedelta(seconds=1))
    api_a.get("/api/v1/occurrences")  # the first request of a key also records its use
    with CaptureQueriesContext(connection) as one_row:
        api_a.get("/api/v1/occurrences")
    for i in range(1, 20):
        moment = at + timedelta(seconds=i)
        attempt_started(_due(tenant_a, moment), moment + timedelta(seconds=1))

    with CaptureQueriesContext(connection) as twenty_rows:
        listed = api_a.get("/api/v1/occurrences").json()["results"]

    assert [o["start_lag_s"] for o in listed] == [1.0] * 20
    assert len(twenty_rows) == len(one_row)


def test_the_schema_documents_start_lag_as_read_only(api_a):
    schema = api_a.get("/api/schema/", {"format": "json"})

    assert schema.status_code == 200
    field = schema.json()["components"]["schemas"]["Occurrence"]["properties"]["start_lag_s"]
    assert field["readOnly"] is True and field["nullable"] is True
    assert "first attempt" in field["description"]
