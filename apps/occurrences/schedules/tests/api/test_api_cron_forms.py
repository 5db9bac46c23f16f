"""The day forms (L, W, #, ?) and wrapped ranges through the API: accepted with the instants
they mean; malformed ones answer 400 naming `expression`, and nothing is written."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import time_machine

from apps.schedules.models import Schedule, ScheduleVersion

pytestmark = pytest.mark.django_db

FROZEN = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
CRON = {"name": "n", "kind": "cron", "time_zone": "UTC", "handler": "record"}

MALFORMED = [
    "L * * * *",  # L in the minute field
    "0 9 * * MON#6",  # no sixth Monday
    "0 9 32W * *",  # no 32nd day
    "0 9 * * L",  # Quartz's Saturday: refused as ambiguous
    "0 9 L-31 * *",
    "0 9 * ? *",
    "0 0 * 2 MON#5",  # a fifth Monday in February: decades apart
    "0 0 30W 2 *",  # never
]


def _fields(response: Any) -> list[str]:
    return list(response.json()["error"]["fields"])


@time_machine.travel(FROZEN, tick=False)
@pytest.mark.parametrize("expression", MALFORMED)
def test_a_malformed_form_is_a_400_on_expression_and_nothing_is_written(api_a, expression):
    for route in ("/api/v1/schedules", "/api/v1/schedules/preview"):
        response = api_a.post(route, {**CRON, "expression": expression}, format="json")

        assert response.status_code == 400, response.content
        assert _fields(response) == ["expression"]
    assert Schedule.objects.count() == 0


@time_machine.travel(FROZEN, tick=False)
def test_an_update_to_a_malformed_form_changes_nothing(api_a):
    created = api_a.post("/api/v1/schedules", {**CRON, "expression": "0 9 L * *"}, format="json")
    assert created.status_code == 201, created.content
    sid = created.json()["id"]

    response = api_a.patch(
        f"/api/v1/schedules/{sid}", {"expression": "0 9 * * FRI#6"}, format="json"
    )

    assert response.status_code == 400
    assert _fields(response) == ["expression"]
    schedule = Schedule.objects.get(pk=sid)
    assert (schedule.expression, schedule.version) == ("0 9 L * *", 1)
    assert ScheduleVersion.objects.filter(schedule_id=sid).count() == 1


@time_machine.travel(FROZEN, tick=False)
@pytest.mark.parametrize(
    ("expression", "zone", "first"),
    [
        ("0 0 L * *", "UTC", "2026-01-31T00:00:00Z"),
        ("0 9 ? * MON#2", "Europe/London", "2026-01-12T09:00:00Z"),
        ("0 18 LW * ?", "America/New_York", "2026-01-30T23:00:00Z"),  # Friday, EST
        ("0 9 15W * *", "UTC", "2026-01-15T09:00:00Z"),
        ("0 9 * * FRI-MON", "UTC", "2026-01-02T09:00:00Z"),
        ("0 9 1 NOV-MAR *", "UTC", "2026-02-01T09:00:00Z"),
    ],
)
def test_forms_are_accepted_and_run_when_they_mean(api_a, expression, zone, first):
    response = api_a.post(
        "/api/v1/schedules", {**CRON, "expression": expression, "time_zone": zone}, format="json"
    )

    assert response.status_code == 201, response.content
    assert response.json()["next_run_at"] == first
    preview = api_a.get(f"/api/v1/schedules/{response.json()['id']}/preview?count=1")
    assert [e["at_utc"] for e in preview.json()] == [first]
