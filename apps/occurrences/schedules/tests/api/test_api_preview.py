"""Previews (saved and draft) and one-shot local times through the API: they call timerules."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import time_machine

from apps.schedules.models import Schedule

pytestmark = pytest.mark.django_db

FROZEN = datetime(2026, 3, 7, 12, 0, tzinfo=UTC)


@time_machine.travel(FROZEN, tick=False)
def test_draft_preview_notes_the_skipped_spring_forward_time_and_stores_nothing(api_a):
    response = api_a.post(
        "/api/v1/schedules/preview",
        {"kind": "cron", "expression": "30 2 * * *", "time_zone": "America/New_York", "count": 2},
        format="json",
    )

    assert response.status_code == 200, response.content
    entries = response.json()
    # 2026-03-08 02:30 does not exist in New York, so the next two fires are the 9th and 10th.
    assert [e["at_utc"] for e in entries] == ["2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"]
    assert entries[0]["local_wall"] == "2026-03-09 02:30"
    assert entries[0]["utc_offset"] == "-04:00"
    assert "does not exist on 2026-03-08" in entries[0]["note"]
    assert Schedule.objects.count() == 0


@time_machine.travel(FROZEN, tick=False)
def test_saved_preview_returns_count_entries_and_outsider_gets_404(api_a, api_b):
    created = api_a.post(
        "/api/v1/schedules",
        {"name": "n", "kind": "cron", "expression": "0 9 * * *", "time_zone": "Europe/London",
         "handler": "record"},
        format="json",
    ).json()  # fmt: skip

    response = api_a.get(f"/api/v1/schedules/{created['id']}/preview?count=3")

    assert response.status_code == 200
    assert [e["at_utc"] for e in response.json()] == [
        "2026-03-08T09:00:00Z",
        "2026-03-09T09:00:00Z",
        "2026-03-10T09:00:00Z",
    ]
    assert api_b.get(f"/api/v1/schedules/{created['id']}/preview").status_code == 404
    assert api_a.get(f"/api/v1/schedules/{created['id']}/preview?count=0").status_code == 400


@time_machine.travel(FROZEN, tick=False)
def test_one_shot_local_wall_time_is_resolved_in_its_zone(api_a):
    response = api_a.post(
        "/api/v1/schedules",
        {"name": "o", "kind": "one_shot", "run_at": "2026-03-08T09:30",
         "time_zone": "America/New_York", "handler": "record"},
        format="json",
    )  # fmt: skip

    assert response.status_code == 201, response.content
    # After the switch New York is UTC-4: 09:30 local is 13:30 UTC.
    assert response.json()["next_run_at"] == "2026-03-08T13:30:00Z"


@time_machine.travel(FROZEN, tick=False)
def test_one_shot_in_the_spring_forward_gap_is_refused_unless_shifted(api_a):
    body = {"name": "o", "kind": "one_shot", "run_at": "2026-03-08T02:30",
            "time_zone": "America/New_York", "handler": "record"}  # fmt: skip

    refused = api_a.post("/api/v1/schedules", body, format="json")
    shifted = api_a.post("/api/v1/schedules", {**body, "dst_gap": "shift"}, format="json")

    assert refused.status_code == 400
    assert "does not exist" in refused.json()["error"]["fields"]["run_at"][0]
    assert shifted.status_code == 201
    assert shifted.json()["next_run_at"] == "2026-03-08T07:00:00Z"  # 03:00 EDT
    assert Schedule.objects.count() == 1
