"""Query and response hygiene of the schedule API (docs/api.md, "Query parameters, letter
case, timestamps"): unknown query parameters are refused by name, enum filters take any case,
an invalid body names every bad field, and every instant is written in UTC with `Z`."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.occurrences.models import Occurrence
from apps.occurrences.tests.support.instants import instants, not_in_z
from apps.occurrences.tests.support.rows import occurrence
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule

pytestmark = pytest.mark.django_db

CRON = {"name": "report", "kind": "cron", "expression": "0 9 * * *",
        "time_zone": "Europe/Berlin", "handler": "noop"}  # fmt: skip


def test_an_unknown_query_parameter_on_the_schedule_list_is_a_400_naming_it(api_a, tenant_a):
    make_schedule(tenant_a)

    response = api_a.get("/api/v1/schedules", {"status": "active", "limit": "5"})

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert sorted(error["fields"]) == ["limit", "status"]
    assert "state" in error["fields"]["status"][0]  # the message lists what the list reads


def test_unknown_and_bad_known_query_parameters_are_reported_together(api_a):
    response = api_a.get("/api/v1/schedules", {"state": "sleeping", "sort": "name"})

    assert response.status_code == 400
    assert sorted(response.json()["error"]["fields"]) == ["sort", "state"]


def test_known_query_parameters_still_list(api_a, tenant_a):
    make_schedule(tenant_a, name="nightly report")

    response = api_a.get(
        "/api/v1/schedules",
        {"state": "active", "kind": "cron", "handler": "record", "q": "report", "page_size": 5},
    )

    assert response.status_code == 200, response.content
    assert [s["name"] for s in response.json()["results"]] == ["nightly report"]
    assert api_a.get("/api/v1/schedules", {"cursor": ""}).status_code == 200


def test_an_unknown_query_parameter_on_the_saved_preview_is_a_400(api_a, tenant_a):
    schedule = make_schedule(tenant_a)

    response = api_a.get(f"/api/v1/schedules/{schedule.id}/preview", {"limit": "3"})

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["limit"]


@pytest.mark.parametrize("kind", ["CRON", "Cron", "cron"])
def test_the_kind_filter_takes_any_case(api_a, tenant_a, kind):
    cron = make_schedule(tenant_a, name="cron one")
    make_schedule(
        tenant_a, name="one-shot", kind=Schedule.Kind.ONE_SHOT, expression="",
        run_at=timezone.now() + timedelta(days=1),
    )  # fmt: skip

    response = api_a.get("/api/v1/schedules", {"kind": kind, "state": "Active"})

    assert response.status_code == 200, response.content
    assert [s["id"] for s in response.json()["results"]] == [str(cron.id)]


def test_a_create_with_a_bad_expression_and_a_bad_zone_names_both(api_a):
    body = {**CRON, "expression": "61 * * * *", "time_zone": "Mars/Olympus"}

    response = api_a.post("/api/v1/schedules", body, format="json")

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert sorted(error["fields"]) == ["expression", "time_zone"]
    assert "out of range" in error["fields"]["expression"][0]
    assert "Mars/Olympus" in error["fields"]["time_zone"][0]
    assert Schedule.objects.count() == 0


def test_a_field_error_does_not_hide_the_rule_errors(api_a):
    # An unknown handler fails on its own field; the expression and the bounds are judged too.
    body = {**CRON, "handler": "nope", "expression": "* * *", "precision": "flexible",
            "start_at": "2027-01-02T00:00:00Z", "end_at": "2027-01-01T00:00:00Z"}  # fmt: skip

    response = api_a.post("/api/v1/schedules", body, format="json")

    assert response.status_code == 400
    fields = response.json()["error"]["fields"]
    assert sorted(fields) == ["end_at", "expression", "flexible_window_s", "handler"]
    assert fields["end_at"] == [
        "end_at (2027-01-01T00:00:00Z) must be after start_at (2027-01-02T00:00:00Z)."
    ]


def test_an_update_names_every_bad_field(api_a, tenant_a):
    schedule = make_schedule(tenant_a)

    response = api_a.patch(
        f"/api/v1/schedules/{schedule.id}",
        {"expression": "0 25 * * *", "time_zone": "Europe/Berln", "max_lateness_s": -1},
        format="json",
    )

    assert response.status_code == 400
    assert sorted(response.json()["error"]["fields"]) == [
        "expression", "max_lateness_s", "time_zone",
    ]  # fmt: skip


def test_a_one_shot_in_a_bad_zone_reports_the_zone_not_its_run_at(api_a):
    body = {"name": "once", "kind": "one_shot", "run_at": "2030-01-01T09:00",
            "time_zone": "Nowhere/Land", "handler": "noop", "expression": "0 9 * * *"}  # fmt: skip

    response = api_a.post("/api/v1/schedules", body, format="json")

    assert response.status_code == 400
    assert sorted(response.json()["error"]["fields"]) == ["expression", "time_zone"]


def test_timestamps_of_a_schedule_and_its_receipts_end_in_z(api_a, tenant_a):
    created = api_a.post("/api/v1/schedules", CRON, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    replayed = api_a.post("/api/v1/schedules", CRON, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    schedule_id = created.json()["id"]
    schedule = Schedule.objects.get(id=schedule_id)
    # In flight when the update lands: listed in the receipt's not_recalled.
    occurrence(schedule, timezone.now() + timedelta(hours=1), state=Occurrence.State.ENQUEUED)
    detail = api_a.get(f"/api/v1/schedules/{schedule_id}")
    updated = api_a.patch(
        f"/api/v1/schedules/{schedule_id}", {"expression": "30 9 * * *"}, format="json"
    )
    paused = api_a.post(f"/api/v1/schedules/{schedule_id}/pause")
    listed = api_a.get("/api/v1/schedules")

    assert replayed.headers["Idempotent-Replayed"] == "true"
    assert [r.status_code for r in (created, detail, updated, paused, listed)] == [
        201, 200, 200, 200, 200,
    ]  # fmt: skip
    assert len(detail.json()["next_fires"]) == 5
    assert updated.json()["receipt"]["not_recalled"][0]["scheduled_for"].endswith("Z")
    assert paused.json()["receipt"]["at"].endswith("Z")
    for response in (created, replayed, detail, updated, paused, listed):
        assert list(instants(response.json())), response.json()
        assert not_in_z(response.json()) == []


BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


def test_a_browser_gets_json_not_the_browsable_api(api_a, client):
    with_key = api_a.get("/api/v1/schedules", HTTP_ACCEPT=BROWSER_ACCEPT)
    without_key = client.get("/api/v1/schedules", HTTP_ACCEPT=BROWSER_ACCEPT)

    for response in (with_key, without_key):
        assert response["Content-Type"] == "application/json"
        assert b"<html" not in response.content
    assert (with_key.status_code, without_key.status_code) == (200, 401)


def test_the_schema_and_its_docs_are_public_and_hold_no_tenant_data(client, tenant_a):
    make_schedule(tenant_a, name="secret-sounding schedule")

    schema = client.get("/api/schema/")
    docs = client.get("/api/docs/")

    assert schema.status_code == docs.status_code == 200
    assert b"secret-sounding" not in schema.content
    assert str(tenant_a.id).encode() not in schema.content
