"""Fixed-rate (interval) schedules through the API: create, read, preview, update; a bad
period is a 400 naming its field and writes nothing (docs/api.md, docs/timerules.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine

from apps.schedules.models import Schedule, ScheduleEvent, ScheduleVersion

pytestmark = pytest.mark.django_db

FROZEN = datetime(2026, 12, 4, 9, 0, 12, 345678, tzinfo=UTC)
INTERVAL = {
    "name": "every 90",
    "kind": "interval",
    "interval_s": 5400,
    "time_zone": "Europe/Berlin",
    "handler": "record",
}


def _fields(response: Any) -> list[str]:
    return list(response.json()["error"]["fields"])


def _nothing_written() -> None:
    assert Schedule.objects.count() == 0
    assert ScheduleVersion.objects.count() == 0
    assert ScheduleEvent.objects.count() == 0


@time_machine.travel(FROZEN, tick=False)
def test_create_anchors_at_creation_rounded_up_to_the_second_and_runs_from_there(api_a):
    response = api_a.post("/api/v1/schedules", INTERVAL, format="json")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["kind"] == "interval" and body["interval_s"] == 5400
    assert body["expression"] == "" and body["run_at"] is None
    assert body["start_at"] == "2026-12-04T09:00:13Z"
    assert body["next_fires"] == [
        "2026-12-04T09:00:13Z",
        "2026-12-04T10:30:13Z",
        "2026-12-04T12:00:13Z",
        "2026-12-04T13:30:13Z",
        "2026-12-04T15:00:13Z",
    ]
    version = ScheduleVersion.objects.get(schedule_id=body["id"])
    assert version.definition["interval_s"] == 5400
    assert version.definition["kind"] == Schedule.Kind.INTERVAL


@time_machine.travel(FROZEN, tick=False)
def test_a_given_anchor_sets_the_phase_and_a_past_anchor_runs_from_the_next_instant(api_a):
    body = {**INTERVAL, "interval_s": 36 * 3600, "start_at": "2026-12-01T06:00:00+01:00"}
    response = api_a.post("/api/v1/schedules", body, format="json")

    assert response.status_code == 201, response.content
    # 2026-12-01 05:00Z + k * 36 h: 12-02 17:00Z, 12-04 05:00Z, 12-05 17:00Z
    assert response.json()["next_fires"][:2] == ["2026-12-05T17:00:00Z", "2026-12-07T05:00:00Z"]


@time_machine.travel(FROZEN, tick=False)
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"interval_s": 59}, "interval_s"),
        ({"interval_s": 0}, "interval_s"),
        ({"interval_s": -60}, "interval_s"),
        ({"interval_s": 366 * 86400 + 1}, "interval_s"),
        ({"interval_s": "5400"}, "interval_s"),
        ({"interval_s": 90.5}, "interval_s"),
        ({"interval_s": True}, "interval_s"),
        ({"interval_s": None}, "interval_s"),
        ({"expression": "*/90 * * * *"}, "expression"),
        ({"run_at": "2026-12-05T09:00:00Z"}, "run_at"),
        ({"start_at": "tomorrow"}, "start_at"),
        ({"end_at": "2026-12-04T08:00:00Z"}, "end_at"),
    ],
)
def test_a_bad_definition_is_a_400_on_its_field_and_nothing_is_written(api_a, change, field):
    for route in ("/api/v1/schedules", "/api/v1/schedules/preview"):
        response = api_a.post(route, {**INTERVAL, **change}, format="json")

        assert response.status_code == 400, response.content
        assert _fields(response) == [field], response.content
    _nothing_written()


@time_machine.travel(FROZEN, tick=False)
def test_a_period_missing_is_named(api_a):
    body = {k: v for k, v in INTERVAL.items() if k != "interval_s"}
    response = api_a.post("/api/v1/schedules", body, format="json")

    assert response.status_code == 400
    assert _fields(response) == ["interval_s"]
    _nothing_written()


@time_machine.travel(FROZEN, tick=False)
def test_other_kinds_take_no_period(api_a):
    cron = {"name": "c", "kind": "cron", "expression": "* * * * *", "handler": "record"}
    response = api_a.post("/api/v1/schedules", {**cron, "interval_s": 60}, format="json")

    assert response.status_code == 400
    assert _fields(response) == ["interval_s"]
    _nothing_written()


@time_machine.travel(FROZEN, tick=False)
def test_the_tenant_min_interval_applies(api_a, tenant_a):
    tenant_a.min_interval_s = 300
    tenant_a.save(update_fields=["min_interval_s"])

    refused = api_a.post("/api/v1/schedules", {**INTERVAL, "interval_s": 240}, format="json")

    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "rule_too_frequent"
    assert _fields(refused) == ["interval_s"]
    _nothing_written()
    ok = api_a.post("/api/v1/schedules", {**INTERVAL, "interval_s": 300}, format="json")
    assert ok.status_code == 201
    patched = api_a.patch(
        f"/api/v1/schedules/{ok.json()['id']}", {"interval_s": 120}, format="json"
    )
    assert patched.status_code == 400
    assert _fields(patched) == ["interval_s"]
    assert Schedule.objects.get().interval_s == 300


@time_machine.travel(FROZEN, tick=False)
def test_draft_and_saved_previews_show_elapsed_time_across_dst(api_a):
    # Berlin falls back on 2027-10-31 at 01:00Z; every 90 minutes from 2027-10-30 22:00Z.
    body = {**INTERVAL, "start_at": "2027-10-30T22:00:00Z", "count": 3}
    draft = api_a.post("/api/v1/schedules/preview", body, format="json")

    assert draft.status_code == 200, draft.content
    entries = draft.json()["entries"] if "entries" in draft.json() else draft.json()
    assert [e["at_utc"] for e in entries] == [
        "2027-10-30T22:00:00Z",
        "2027-10-30T23:30:00Z",
        "2027-10-31T01:00:00Z",
    ]
    assert [e["local_wall"] for e in entries] == [
        "2027-10-31 00:00",
        "2027-10-31 01:30",
        "2027-10-31 02:00",  # CET now: 30 wall minutes after 01:30 CEST, 90 elapsed
    ]
    assert entries[2]["note"] and "+02:00 to +01:00" in entries[2]["note"]

    created = api_a.post(
        "/api/v1/schedules", {k: v for k, v in body.items() if k != "count"}, format="json"
    )
    saved = api_a.get(f"/api/v1/schedules/{created.json()['id']}/preview?count=3")
    assert saved.status_code == 200, saved.content
    saved_entries = saved.json()["entries"] if "entries" in saved.json() else saved.json()
    assert [e["at_utc"] for e in saved_entries] == [e["at_utc"] for e in entries]


@time_machine.travel(FROZEN, tick=False)
def test_patch_of_the_period_keeps_the_anchor_and_a_new_start_at_re_anchors(api_a):
    body = {**INTERVAL, "start_at": "2026-12-04T08:00:00Z"}
    sid = api_a.post("/api/v1/schedules", body, format="json").json()["id"]

    patched = api_a.patch(f"/api/v1/schedules/{sid}", {"interval_s": 3600}, format="json")

    assert patched.status_code == 200, patched.content
    schedule = Schedule.objects.get(pk=sid)
    assert (schedule.version, schedule.interval_s) == (2, 3600)
    assert schedule.start_at == datetime(2026, 12, 4, 8, 0, tzinfo=UTC)
    # Phase kept: 08:00Z + k hours, strictly after the boundary (09:00:12).
    assert schedule.next_run_at == datetime(2026, 12, 4, 10, 0, tzinfo=UTC)

    moved = api_a.patch(
        f"/api/v1/schedules/{sid}", {"start_at": "2026-12-04T09:20:00Z"}, format="json"
    )
    assert moved.status_code == 200, moved.content
    schedule.refresh_from_db()
    assert schedule.next_run_at == datetime(2026, 12, 4, 9, 20, tzinfo=UTC)


@time_machine.travel(FROZEN, tick=False)
def test_a_bad_patch_changes_nothing(api_a):
    sid = api_a.post("/api/v1/schedules", INTERVAL, format="json").json()["id"]

    for change in ({"interval_s": 30}, {"interval_s": None}, {"expression": "* * * * *"}):
        response = api_a.patch(f"/api/v1/schedules/{sid}", change, format="json")
        assert response.status_code == 400, response.content
    schedule = Schedule.objects.get(pk=sid)
    assert (schedule.version, schedule.interval_s) == (1, 5400)
    assert ScheduleVersion.objects.filter(schedule_id=sid).count() == 1


@time_machine.travel(FROZEN, tick=False)
def test_kind_switch_from_cron_to_interval_and_back(api_a):
    cron = {"name": "c", "kind": "cron", "expression": "0 * * * *", "handler": "record"}
    sid = api_a.post("/api/v1/schedules", cron, format="json").json()["id"]

    to_interval = api_a.patch(
        f"/api/v1/schedules/{sid}",
        {"kind": "interval", "expression": "", "interval_s": 7200},
        format="json",
    )
    assert to_interval.status_code == 200, to_interval.content
    schedule = Schedule.objects.get(pk=sid)
    assert schedule.kind == Schedule.Kind.INTERVAL
    anchor = FROZEN.replace(microsecond=0) + timedelta(seconds=1)
    assert schedule.start_at == anchor
    assert schedule.next_run_at == anchor

    back = api_a.patch(
        f"/api/v1/schedules/{sid}",
        {"kind": "cron", "expression": "0 * * * *", "interval_s": None},
        format="json",
    )
    assert back.status_code == 200, back.content
    assert Schedule.objects.get(pk=sid).interval_s is None


@time_machine.travel(FROZEN, tick=False)
def test_list_filter_by_kind(api_a):
    api_a.post("/api/v1/schedules", INTERVAL, format="json")
    cron = {"name": "c", "kind": "cron", "expression": "0 * * * *", "handler": "record"}
    api_a.post("/api/v1/schedules", cron, format="json")

    listed = api_a.get("/api/v1/schedules?kind=interval").json()
    items = listed["results"] if isinstance(listed, dict) else listed
    assert [s["kind"] for s in items] == ["interval"]
