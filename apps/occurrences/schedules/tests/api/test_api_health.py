"""The API's schedules carry the list page's health (docs/api.md): last_run, last_success_at
and success_rate, read for a whole page in one query."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.occurrences.execution.claim import occurrence_claim
from apps.occurrences.execution.complete import attempt_complete
from apps.occurrences.execution.handlers import PermanentError
from apps.occurrences.models import Occurrence
from apps.occurrences.tests.support.rows import occurrence, schedule

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 3, 9, 30, 5, tzinfo=UTC)


def _run(sched, due: datetime, *, fail: bool = False) -> None:
    occ = occurrence(sched, due, state=Occurrence.State.ENQUEUED)
    claim = occurrence_claim(
        occurrence_id=occ.id, scheduled_for=due, worker_id="w", now=due + timedelta(seconds=1)
    )
    error = PermanentError("HTTP 410") if fail else None
    attempt_complete(claim=claim, error=error, now=due + timedelta(seconds=3))


@time_machine.travel(NOW, tick=False)
def test_list_and_detail_carry_last_run_last_success_and_success_rate(api_a, tenant_a):
    ran = schedule(tenant_a, name="ran")
    _run(ran, datetime(2026, 12, 3, 8, 0, tzinfo=UTC))
    _run(ran, datetime(2026, 12, 3, 9, 0, tzinfo=UTC), fail=True)
    idle = schedule(tenant_a, name="idle")

    listed = {s["name"]: s for s in api_a.get("/api/v1/schedules").json()["results"]}
    single = api_a.get(f"/api/v1/schedules/{ran.id}").json()

    for body in (listed["ran"], single):
        assert body["last_run"] == {"state": "DEAD", "at": "2026-12-03T09:00:03Z"}
        assert body["last_success_at"] == "2026-12-03T08:00:03Z"
        assert body["success_rate"] == 0.5
    assert (listed["idle"]["last_run"], listed["idle"]["last_success_at"]) == (None, None)
    assert listed["idle"]["success_rate"] is None
    assert str(idle.id) == listed["idle"]["id"]


@time_machine.travel(NOW, tick=False)
def test_the_health_of_a_page_costs_the_same_queries_for_more_schedules(api_a, tenant_a):
    for i in range(2):
        _run(schedule(tenant_a, name=f"a{i}"), datetime(2026, 12, 3, 9, 0, tzinfo=UTC))
    api_a.get("/api/v1/schedules")  # warm the key's caches
    with CaptureQueriesContext(connection) as few:
        api_a.get("/api/v1/schedules")
    for i in range(8):
        _run(schedule(tenant_a, name=f"b{i}"), datetime(2026, 12, 3, 9, 0, tzinfo=UTC))
    with CaptureQueriesContext(connection) as many:
        body = api_a.get("/api/v1/schedules").json()

    assert len(body["results"]) == 10
    assert all(s["success_rate"] == 1.0 for s in body["results"])
    assert len(many.captured_queries) == len(few.captured_queries)


def test_health_fields_are_server_owned(api_a, tenant_a):
    sched = schedule(tenant_a, name="owned")

    response = api_a.patch(f"/api/v1/schedules/{sched.id}", {"success_rate": 1}, format="json")

    assert response.status_code == 400
    assert "set by the server" in str(response.json())
