"""The schedule API: bearer-key auth, tenant doors, validation that changes nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from rest_framework.test import APIClient

from apps.schedules.models import Schedule, ScheduleEvent, ScheduleVersion

pytestmark = pytest.mark.django_db

CRON = {
    "name": "nightly report",
    "kind": "cron",
    "expression": "0 9 * * *",
    "time_zone": "America/New_York",
    "handler": "record",
    "payload": {"report": "daily"},
}


@time_machine.travel(datetime(2026, 3, 7, 15, 0, tzinfo=UTC), tick=False)
def test_create_cron_schedule_returns_version_state_and_next_fires_in_utc(api_a, tenant_a):
    response = api_a.post("/api/v1/schedules", CRON, format="json")

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["version"], body["state"], body["kind"]) == (1, "ACTIVE", "cron")
    # 09:00 New York is 14:00 UTC before the 2026-03-08 switch and 13:00 UTC after it.
    assert body["next_run_at"] == "2026-03-08T13:00:00Z"
    assert body["next_fires"][:3] == [
        "2026-03-08T13:00:00Z",
        "2026-03-09T13:00:00Z",
        "2026-03-10T13:00:00Z",
    ]
    schedule = Schedule.objects.get(id=body["id"])
    assert schedule.tenant == tenant_a
    assert ScheduleVersion.objects.filter(schedule=schedule, version=1).count() == 1
    event = ScheduleEvent.objects.get(schedule=schedule)
    assert event.kind == "created" and event.actor.startswith("api-key:tick_")


def test_missing_or_unknown_key_is_401():
    anonymous = APIClient()
    assert anonymous.get("/api/v1/schedules").status_code == 401
    wrong = APIClient()
    wrong.credentials(HTTP_AUTHORIZATION="Bearer tick_not-a-real-key")
    assert wrong.post("/api/v1/schedules", CRON, format="json").status_code == 401
    assert Schedule.objects.count() == 0


def test_outsider_gets_404_for_another_tenants_schedule_and_sees_none_in_lists(api_a, api_b):
    schedule_id = api_a.post("/api/v1/schedules", CRON, format="json").json()["id"]

    assert api_b.get(f"/api/v1/schedules/{schedule_id}").status_code == 404
    assert api_b.get("/api/v1/schedules").json()["results"] == []
    assert api_b.get(f"/api/v1/occurrences?schedule={schedule_id}").json()["results"] == []
    assert api_a.get(f"/api/v1/schedules/{schedule_id}").status_code == 200


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"time_zone": "Mars/Olympus_Mons"}, "time_zone"),
        ({"expression": "61 * * * *"}, "expression"),
        ({"expression": "0 0 30 2 *"}, "expression"),
        ({"handler": "rm -rf"}, "handler"),
        ({"version": 7}, "version"),
        ({"state": "PAUSED"}, "state"),
        ({"tenant": "someone-else"}, "tenant"),
        ({"flexible_window_s": 301}, "flexible_window_s"),
        ({"start_at": "2027-01-02T00:00:00Z", "end_at": "2027-01-01T00:00:00Z"}, "end_at"),
        ({"name": "x" * 201}, "name"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_writes_nothing(api_a, change, field):
    response = api_a.post("/api/v1/schedules", {**CRON, **change}, format="json")

    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"]
    assert Schedule.objects.count() == 0
    assert ScheduleEvent.objects.count() == 0


def test_one_shot_in_the_past_beyond_max_lateness_is_refused(api_a):
    past = datetime.now(UTC) - timedelta(minutes=10)
    response = api_a.post(
        "/api/v1/schedules",
        {"name": "late", "kind": "one_shot", "run_at": past.isoformat(), "handler": "record",
         "max_lateness_s": 60},
        format="json",
    )  # fmt: skip

    assert response.status_code == 400
    assert "run_at" in response.json()["error"]["fields"]
    assert Schedule.objects.count() == 0


def test_openapi_schema_lists_the_schedule_routes(client):
    response = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")

    assert response.status_code == 200
    paths = response.json()["paths"]
    assert {"/api/v1/schedules", "/api/v1/schedules/{schedule_id}", "/api/v1/occurrences"} <= set(
        paths
    )


def test_interactive_docs_load_their_assets_locally(client):
    response = client.get("/api/docs/")

    assert response.status_code == 200
    html = response.content.decode()
    assert "swagger-ui" in html
    assert "cdn.jsdelivr.net" not in html and "unpkg.com" not in html


def test_metrics_endpoint_exports_ticks_delivery_metrics(client):
    response = client.get("/metrics")

    assert response.status_code == 200
    text = response.content.decode()
    assert "tick_schedule_lag_seconds_bucket" in text
    assert "tick_duplicate_claims_total" in text


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"url": "ftp://example.com/hook"},
        {"url": "http://127.0.0.1/hook"},
        {"url": "http://2130706433/"},
    ],
)
def test_webhook_schedule_with_a_bad_or_internal_target_is_refused_at_create(api_a, payload):
    body = {**CRON, "handler": "webhook", "payload": payload}

    response = api_a.post("/api/v1/schedules", body, format="json")

    assert response.status_code == 400, response.content
    assert "payload" in json.dumps(response.json())
    assert Schedule.objects.count() == 0


def test_webhook_schedule_with_a_public_https_target_is_accepted(api_a):
    body = {**CRON, "handler": "webhook", "payload": {"url": "https://example.com/hook"}}

    response = api_a.post("/api/v1/schedules", body, format="json")

    assert response.status_code == 201, response.content


def test_committed_openapi_schema_matches_the_code(tmp_path):
    # docs/openapi.yaml is what clients read: regenerate it with `make schema` on API changes.
    from django.conf import settings
    from django.core.management import call_command

    committed = settings.BASE_DIR / "docs" / "openapi.yaml"
    generated = tmp_path / "openapi.yaml"
    call_command("spectacular", "--file", str(generated), "--validate")
    assert generated.read_text() == committed.read_text(), "run `make schema`"
