"""Web UI of schedules: list, detail, create/edit with live preview, pause/resume/cancel
receipts — through the same serializer and services as the API, with the tenancy trio."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.utils import timezone

from apps.occurrences.tests.support.rows import occurrence
from apps.schedules.models import Schedule, ScheduleEvent
from apps.schedules.tests.factories import make_schedule

pytestmark = pytest.mark.django_db

FORM = {
    "name": "nightly report", "kind": "cron", "expression": "0 9 * * *",
    "time_zone": "Europe/Paris", "precision": "strict", "misfire_policy": "fire_once",
    "overlap_policy": "allow", "dst_gap": "skip", "dst_fold": "first", "handler": "record",
    "payload": '{"report": "sales"}',
}  # fmt: skip


def test_list_shows_only_the_tenants_schedules(client, alice, tenant_a, tenant_b):
    mine = make_schedule(tenant_a, name="alpha job")
    make_schedule(tenant_b, name="bravo job")
    client.force_login(alice)

    response = client.get("/schedules/")

    assert response.status_code == 200
    assert [s.id for s in response.context["schedules"]] == [mine.id]


def test_list_filters_and_searches(client, alice, tenant_a):
    make_schedule(tenant_a, name="billing sync")
    paused = make_schedule(tenant_a, name="report export")
    Schedule.objects.filter(pk=paused.pk).update(state="PAUSED")
    client.force_login(alice)

    by_name = client.get("/schedules/", {"q": "billing"}).context["schedules"]
    by_state = client.get("/schedules/", {"state": "paused"}).context["schedules"]

    assert [s.name for s in by_name] == ["billing sync"]
    assert [s.id for s in by_state] == [paused.id]


def test_list_filters_by_kind_in_any_case_like_the_api(client, alice, tenant_a):
    cron = make_schedule(tenant_a, name="every minute")
    client.force_login(alice)

    for spelled in ("cron", "CRON", "Cron"):
        response = client.get("/schedules/", {"kind": spelled})
        assert response.context["errors"] == []
        assert [s.id for s in response.context["schedules"]] == [cron.id]
    assert client.get("/schedules/", {"kind": "ONE_SHOT"}).context["schedules"] == []


def test_list_pages_by_keyset(client, alice, tenant_a):
    made = [make_schedule(tenant_a, name=f"job {i:02d}") for i in range(30)]
    client.force_login(alice)

    first = client.get("/schedules/")
    second = client.get("/schedules/", {"after": first.context["next_cursor"]})

    ids = [s.id for s in first.context["schedules"]] + [s.id for s in second.context["schedules"]]
    assert len(first.context["schedules"]) == 25
    assert second.context["next_cursor"] is None
    assert sorted(ids) == sorted(s.id for s in made) and len(set(ids)) == 30


def test_empty_list_invites_to_create(client, alice):
    client.force_login(alice)

    assert "Create the first one" in client.get("/schedules/").content.decode()


def test_detail_shows_version_events_preview_and_recent_occurrences(client, alice, tenant_a):
    schedule = make_schedule(tenant_a, expression="30 2 * * *", time_zone="America/New_York")
    occurrence(schedule, timezone.now() - timedelta(minutes=5), state="SUCCEEDED")
    client.force_login(alice)

    response = client.get(f"/schedules/{schedule.id}/")

    assert response.status_code == 200
    assert len(response.context["preview"]) == 10
    assert [e.kind for e in response.context["events"]] == ["created"]
    assert len(response.context["recent"]) == 1
    assert 'id="pause"' in response.content.decode()


def test_outsider_gets_404_for_every_schedule_page(client, charlie, tenant_a):
    schedule = make_schedule(tenant_a)
    client.force_login(charlie)

    for url in ("", "edit/"):
        assert client.get(f"/schedules/{schedule.id}/{url}").status_code == 404
    for action in ("pause", "resume", "cancel", "edit"):
        assert client.post(f"/schedules/{schedule.id}/{action}/", FORM).status_code == 404
    schedule.refresh_from_db()
    assert (schedule.state, schedule.version) == ("ACTIVE", 1)


def test_viewer_sees_the_schedule_but_no_controls_and_cannot_change_it(client, bob, tenant_a):
    schedule = make_schedule(tenant_a)
    client.force_login(bob)

    page = client.get(f"/schedules/{schedule.id}/").content.decode()
    assert 'id="pause"' not in page and "Edit" not in page

    for action in ("pause", "cancel"):
        assert client.post(f"/schedules/{schedule.id}/{action}/").status_code == 403
    assert client.post(f"/schedules/{schedule.id}/edit/", FORM).status_code == 403
    assert client.post("/schedules/new/", FORM).status_code == 403
    schedule.refresh_from_db()
    assert (schedule.state, schedule.version) == ("ACTIVE", 1)
    assert Schedule.objects.count() == 1


def test_admin_creates_a_schedule_through_the_service(client, alice, tenant_a):
    client.force_login(alice)

    response = client.post("/schedules/new/", FORM)

    schedule = Schedule.objects.get(tenant=tenant_a)
    assert response.status_code == 302
    assert response["Location"] == f"/schedules/{schedule.id}/"
    assert (schedule.expression, schedule.time_zone, schedule.payload) == (
        "0 9 * * *", "Europe/Paris", {"report": "sales"},
    )  # fmt: skip
    event = ScheduleEvent.objects.get(schedule=schedule)
    assert (event.kind, event.actor) == ("created", "user:alice")


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"expression": "0 0 30 2 *"}, "expression", "never"),
        ({"expression": "61 * * * *"}, "expression", ""),
        ({"time_zone": "Mars/Olympus"}, "time_zone", ""),
        ({"payload": "{not json"}, "payload", "Not valid JSON"),
        ({"kind": "one_shot", "expression": "", "run_at": "2001-01-01T00:00Z"}, "run_at", "past"),
    ],
)
def test_invalid_form_shows_field_errors_and_creates_nothing(
    client, alice, changes, field, message
):
    client.force_login(alice)

    response = client.post("/schedules/new/", {**FORM, **changes})

    assert response.status_code == 400
    errors = response.context["form"].errors
    assert field in errors and message in " ".join(errors[field])
    assert Schedule.objects.count() == 0


def test_live_preview_validates_like_the_api_and_shows_dst_notes(client, bob):
    client.force_login(bob)  # the preview stores nothing: viewers may use it too

    # 2027-03-14 02:30 does not exist in New York (spring forward): skipped, with a note.
    with time_machine.travel(datetime(2026, 12, 2, tzinfo=UTC), tick=False):
        ok = client.post("/schedules/preview/", {**FORM, "expression": "30 2 14 3 *",
                                                  "time_zone": "America/New_York"})  # fmt: skip
    bad = client.post("/schedules/preview/", {**FORM, "expression": "0 0 30 2 *"})

    entries = ok.context["entries"]
    assert ok.status_code == 200 and len(entries) == 10
    assert entries[0].at_utc == datetime(2028, 3, 14, 6, 30, tzinfo=UTC)
    assert "does not exist on 2027-03-14" in entries[0].note
    assert "does not exist on 2027-03-14" in ok.content.decode()
    assert bad.context["entries"] is None and "expression" in bad.context["form"].errors
    assert "never" in bad.content.decode()


def test_pause_shows_the_receipt_and_resume_and_cancel_work(client, alice, tenant_a):
    schedule = make_schedule(tenant_a)
    client.force_login(alice)

    paused = client.post(f"/schedules/{schedule.id}/pause/")
    assert paused.status_code == 200
    assert paused.context["receipt"].action == "paused"
    assert "Receipt: paused" in paused.content.decode()
    resumed = client.post(f"/schedules/{schedule.id}/resume/")
    assert resumed.context["receipt"].action == "resumed"
    canceled = client.post(f"/schedules/{schedule.id}/cancel/")
    assert canceled.context["receipt"].action == "canceled"
    schedule.refresh_from_db()
    assert schedule.state == "CANCELED"
    events = ScheduleEvent.objects.filter(schedule=schedule).order_by("at", "id")
    assert [(e.kind, e.actor) for e in events][1:] == [
        ("paused", "user:alice"), ("resumed", "user:alice"), ("canceled", "user:alice"),
    ]  # fmt: skip


def test_refused_transition_shows_the_error(client, alice, tenant_a):
    schedule = make_schedule(tenant_a)
    client.force_login(alice)
    client.post(f"/schedules/{schedule.id}/cancel/")

    response = client.post(f"/schedules/{schedule.id}/pause/")

    assert response.status_code == 409
    assert "cannot be paused" in response.content.decode()


def test_edit_makes_a_new_version_with_a_receipt_and_history(client, alice, tenant_a):
    schedule = make_schedule(tenant_a, expression="0 9 * * *", time_zone="Europe/Paris")
    client.force_login(alice)
    assert client.get(f"/schedules/{schedule.id}/edit/").status_code == 200

    response = client.post(f"/schedules/{schedule.id}/edit/", {**FORM, "expression": "0 10 * * *"})

    assert response.status_code == 200
    assert response.context["receipt"].action == "updated"
    schedule.refresh_from_db()
    assert (schedule.version, schedule.expression) == (2, "0 10 * * *")
    latest = response.context["versions"][0]
    assert ("expression", "0 9 * * *", "0 10 * * *") in latest["changed"]


def test_edit_can_switch_a_cron_schedule_to_one_shot(client, alice, tenant_a):
    schedule = make_schedule(tenant_a, expression="0 9 * * *")
    client.force_login(alice)
    run_at = (timezone.now() + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")

    form = {**FORM, "kind": "one_shot", "expression": "", "run_at": run_at}
    response = client.post(f"/schedules/{schedule.id}/edit/", form)

    assert response.status_code == 200, response.context["form"].errors
    schedule.refresh_from_db()
    assert (schedule.kind, schedule.expression, schedule.version) == ("ONE_SHOT", "", 2)
