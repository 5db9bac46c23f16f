"""Web UI of occurrences: dashboard, list, detail, DLQ with replay; and the support staff's
admin occurrence browser — with the tenancy trio."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.occurrences.models import Attempt, DispatchOutbox, Occurrence
from apps.occurrences.observability import dashboard as dash
from apps.occurrences.tests.support.rows import (
    attempt_started,
    dead_occurrence,
    occurrence,
    schedule,
    state_of,
)

pytestmark = pytest.mark.django_db


def _enqueued(tenant, *, minutes_ago, lag_s, lane="strict"):
    at = (timezone.now() - timedelta(minutes=minutes_ago)).replace(microsecond=0)
    occ = occurrence(schedule(tenant), at, state="SUCCEEDED")
    Occurrence.objects.filter(id=occ.id).update(
        lane=lane, enqueued_at=at + timedelta(seconds=lag_s)
    )
    return occ


def test_dashboard_counts_and_lag_percentiles_are_tenant_scoped(client, alice, tenant_a, tenant_b):
    for lag in (1, 2, 3, 4):
        _enqueued(tenant_a, minutes_ago=2, lag_s=lag)
    _enqueued(tenant_b, minutes_ago=2, lag_s=100)
    dead_occurrence(tenant_a)
    client.force_login(alice)

    response = client.get("/")

    assert response.status_code == 200
    assert response.context["dlq"] == 1
    rows = {state: (hour, day) for state, _, hour, day in response.context["occ_rows"]}
    assert rows["SUCCEEDED"] == (4, 4) and rows["DEAD"] == (1, 1)
    points = response.context["lag_points"]
    assert {p.lane for p in points} == {"strict"} and sum(p.count for p in points) == 4
    assert max(p.p99 for p in points) < 5
    assert "lag-data" in response.content.decode()


def test_lag_percentiles_split_strict_and_flexible(tenant_a):
    now = timezone.now().replace(second=0, microsecond=0)
    bucket_start = now - timedelta(minutes=now.minute % 5 + 10)
    for lag in range(1, 101):
        occ = occurrence(
            schedule(tenant_a), bucket_start + timedelta(seconds=lag), state="SUCCEEDED"
        )
        Occurrence.objects.filter(id=occ.id).update(
            enqueued_at=occ.scheduled_for + timedelta(seconds=lag / 10)
        )
    flex = occurrence(schedule(tenant_a), bucket_start, state="SUCCEEDED")
    Occurrence.objects.filter(id=flex.id).update(
        lane="flexible", available_at=bucket_start + timedelta(seconds=60),
        enqueued_at=bucket_start + timedelta(seconds=61),
    )  # fmt: skip

    points = dash.lag_percentiles(tenant=tenant_a, now=timezone.now())

    by_lane = {p.lane: p for p in points}
    assert set(by_lane) == {"strict", "flexible"}
    assert by_lane["strict"].count == 100
    assert by_lane["strict"].p50 == pytest.approx(5.05)
    assert by_lane["strict"].p99 == pytest.approx(9.901)
    assert (by_lane["flexible"].p50, by_lane["flexible"].p99) == (1.0, 1.0)


def test_empty_dashboard_explains_itself(client, alice):
    client.force_login(alice)

    page = client.get("/").content.decode()

    assert "No schedule yet." in page and "Create a schedule" in page
    assert "no lag to chart yet" in page
    assert "no start lag to chart yet" in page


def _started(tenant, *, at, lag_s, lane="strict", available_after_s=0):
    """An occurrence due at `at` (flexible: available `available_after_s` later) whose
    attempt 1 started `lag_s` after that."""
    occ = occurrence(schedule(tenant), at, state="SUCCEEDED")
    due = at + timedelta(seconds=available_after_s)
    Occurrence.objects.filter(id=occ.id).update(lane=lane, available_at=due)
    attempt_started(occ, due + timedelta(seconds=lag_s))
    return occ


def test_start_lag_percentiles_are_per_lane_tenant_scoped_and_count_first_attempts(
    client, alice, tenant_a, tenant_b
):
    now = timezone.now().replace(second=0, microsecond=0)
    at = now - timedelta(minutes=now.minute % 5 + 10)
    for lag in range(1, 101):
        occ = _started(tenant_a, at=at + timedelta(seconds=lag), lag_s=lag / 10)
        if lag == 100:  # a retry an hour later changes nothing: the first attempt counts
            attempt_started(occ, occ.scheduled_for + timedelta(hours=1), attempt_no=2)
    _started(tenant_a, at=at, lag_s=2, lane="flexible", available_after_s=60)
    _started(tenant_b, at=at, lag_s=500)
    client.force_login(alice)

    response = client.get("/")

    by_lane = {p.lane: p for p in response.context["start_lag_points"]}
    assert set(by_lane) == {"strict", "flexible"}
    assert by_lane["strict"].count == 100
    assert by_lane["strict"].p50 == pytest.approx(5.05)
    assert by_lane["strict"].p99 == pytest.approx(9.901)
    assert (by_lane["flexible"].count, by_lane["flexible"].p99) == (1, 2.0)  # not 62
    page = response.content.decode()
    assert 'id="start-lag-strict"' in page and "start-lag-data" in page


def test_occurrence_pages_show_the_start_lag_of_the_first_attempt(client, alice, tenant_a):
    at = (timezone.now() - timedelta(minutes=3)).replace(microsecond=0)
    started = _started(tenant_a, at=at, lag_s=2.5)
    attempt_started(started, at + timedelta(minutes=2), attempt_no=2)
    flexible = _started(
        tenant_a, at=at - timedelta(minutes=1), lag_s=0.75, lane="flexible", available_after_s=30
    )
    waiting = occurrence(schedule(tenant_a), at - timedelta(minutes=2))
    client.force_login(alice)

    listed = client.get("/occurrences/")
    detail = client.get(f"/occurrences/{started.id}/").content.decode()

    start_lags = {r["occ"].id: r["start_lag"] for r in listed.context["occurrences"]}
    assert start_lags == {started.id: 2.5, flexible.id: 0.75, waiting.id: None}
    page = listed.content.decode()
    assert '<th title="first attempt started − due">Start lag (s)</th>' in page
    assert "<td>2.5</td>" in page and "<td>0.75</td>" in page
    assert "2.5 s" in detail and "first attempt started − scheduled" in detail


def test_the_start_lag_column_costs_no_query_per_row(client, alice, tenant_a):
    at = (timezone.now() - timedelta(minutes=30)).replace(microsecond=0)
    _started(tenant_a, at=at, lag_s=1)
    client.force_login(alice)
    with CaptureQueriesContext(connection) as one_row:
        client.get("/occurrences/")
    for i in range(1, 20):
        _started(tenant_a, at=at + timedelta(seconds=i), lag_s=1)

    with CaptureQueriesContext(connection) as twenty_rows:
        rows = client.get("/occurrences/").context["occurrences"]

    assert [r["start_lag"] for r in rows] == [1.0] * 20
    assert len(twenty_rows) == len(one_row)
    assert Attempt.objects.count() == 20


def test_occurrence_list_is_tenant_scoped_and_filters_by_state(client, alice, tenant_a, tenant_b):
    ok = occurrence(schedule(tenant_a), timezone.now() - timedelta(minutes=3), state="SUCCEEDED")
    dead = dead_occurrence(tenant_a)
    occurrence(schedule(tenant_b), timezone.now() - timedelta(minutes=3), state="SUCCEEDED")
    client.force_login(alice)

    everything = client.get("/occurrences/").context["occurrences"]
    only_dead = client.get("/occurrences/", {"state": "DEAD"}).context["occurrences"]
    by_schedule = client.get("/occurrences/", {"schedule": str(ok.schedule_id)}).context[
        "occurrences"
    ]

    assert {r["occ"].id for r in everything} == {ok.id, dead.id}
    assert [r["occ"].id for r in only_dead] == [dead.id]
    assert [r["occ"].id for r in by_schedule] == [ok.id]


def test_occurrence_list_time_range_is_bounded(client, alice, tenant_a):
    old = occurrence(schedule(tenant_a), timezone.now() - timedelta(days=3), state="SUCCEEDED")
    client.force_login(alice)

    default = client.get("/occurrences/").context["occurrences"]
    wide = client.get(
        "/occurrences/", {"from": (timezone.now() - timedelta(days=4)).strftime("%Y-%m-%dT%H:%M")}
    ).context["occurrences"]

    assert default == []
    assert [r["occ"].id for r in wide] == [old.id]


def test_occurrence_detail_shows_attempts_errors_and_lag(client, bob, tenant_a):
    dead = dead_occurrence(tenant_a, error="webhook answered HTTP 404: nope")
    client.force_login(bob)

    response = client.get(f"/occurrences/{dead.id}/")

    assert response.status_code == 200
    page = response.content.decode()
    assert "webhook answered HTTP 404: nope" in page and "PermanentError" in page
    assert "Replay" not in page  # viewer: read-only


def test_outsider_gets_404_for_occurrence_detail(client, charlie, tenant_a):
    dead = dead_occurrence(tenant_a)
    client.force_login(charlie)

    assert client.get(f"/occurrences/{dead.id}/").status_code == 404
    assert client.get("/occurrences/not-a-uuid/").status_code == 404


def test_dlq_lists_dead_with_last_error(client, alice, tenant_a, tenant_b):
    dead = dead_occurrence(tenant_a, error="boom")
    dead_occurrence(tenant_b)
    occurrence(schedule(tenant_a), timezone.now(), state="SUCCEEDED")
    client.force_login(alice)

    response = client.get("/dlq/")

    rows = response.context["occurrences"]
    assert [r["occ"].id for r in rows] == [dead.id]
    assert rows[0]["last"].error_message == "boom"


def test_dlq_replay_of_a_selection_shows_the_result(client, alice, tenant_a):
    first, second = dead_occurrence(tenant_a, 1), dead_occurrence(tenant_a, 2)
    alive = occurrence(schedule(tenant_a), timezone.now(), state="SUCCEEDED")
    client.force_login(alice)

    response = client.post("/dlq/replay/", {"ids": [str(first.id), str(second.id),
                                                    str(alive.id)]})  # fmt: skip

    assert (response.status_code, response["Location"]) == (302, "/dlq/")
    page = client.get("/dlq/").content.decode()
    assert "Replayed 2 occurrences" in page
    assert f"{str(first.id)[:8]}…" in page and f"{str(second.id)[:8]}…" in page
    assert f"Not DEAD, left alone: {str(alive.id)[:8]}… (SUCCEEDED)" in page
    assert "Replayed" not in client.get("/dlq/").content.decode()  # shown once
    assert (state_of(first), state_of(second)) == ("RETRY_WAIT", "RETRY_WAIT")
    assert DispatchOutbox.objects.filter(lane="retry").count() == 2


def test_viewer_cannot_replay(client, bob, tenant_a):
    dead = dead_occurrence(tenant_a)
    client.force_login(bob)

    assert "Replay selected" not in client.get("/dlq/").content.decode()
    assert client.post("/dlq/replay/", {"ids": [str(dead.id)]}).status_code == 403
    assert state_of(dead) == "DEAD"


def test_outsider_replay_of_another_tenants_id_changes_nothing(client, charlie, tenant_a):
    dead = dead_occurrence(tenant_a)
    client.force_login(charlie)

    response = client.post("/dlq/replay/", {"ids": [str(dead.id)]}, follow=True)

    assert "Replayed 0 occurrences. Not found: 1." in response.content.decode()
    assert state_of(dead) == "DEAD"
    assert DispatchOutbox.objects.count() == 0


def test_empty_dlq_says_so(client, alice):
    client.force_login(alice)

    assert "The DLQ is empty" in client.get("/dlq/").content.decode()


# --- Django admin (support staff) -----------------------------------------------------------


@pytest.fixture
def staff(admin_client):
    return admin_client


def test_admin_occurrence_browser_lists_across_tenants_and_replays(staff, tenant_a, tenant_b):
    dead_a, dead_b = dead_occurrence(tenant_a), dead_occurrence(tenant_b)

    page = staff.get("/admin/occurrences/browse/", {"state": "DEAD"})
    assert page.status_code == 200
    assert {o.id for o in page.context["rows"]} == {dead_a.id, dead_b.id}
    assert page.context["exact"] == 2  # a first page holding every row counts them exactly
    assert staff.get(f"/admin/occurrences/browse/{dead_a.id}/").status_code == 200

    ids = [str(dead_a.id), str(dead_b.id)]
    response = staff.post("/admin/occurrences/browse/replay/", {"ids": ids})

    assert response.status_code == 302
    assert (state_of(dead_a), state_of(dead_b)) == ("RETRY_WAIT", "RETRY_WAIT")


def test_admin_occurrence_browser_refuses_tenant_users(client, alice):
    client.force_login(alice)

    assert client.get("/admin/occurrences/browse/").status_code == 302  # to the admin login


def test_admin_pages_for_tenants_schedules_and_keys_render(staff, tenant_a):
    sched = schedule(tenant_a)
    for url in (
        "/admin/tenants/tenant/", f"/admin/tenants/tenant/{tenant_a.pk}/change/",
        "/admin/schedules/schedule/?q=test", f"/admin/schedules/schedule/{sched.pk}/change/",
        "/admin/tenants/apikey/", "/admin/django_celery_results/taskresult/",
    ):  # fmt: skip
        assert staff.get(url).status_code == 200, url
    usage = staff.get(f"/admin/tenants/tenant/{tenant_a.pk}/change/").content.decode()
    assert "1 / 10000" in usage


def test_admin_pause_action_goes_through_the_service(staff, tenant_a):
    sched = schedule(tenant_a)

    staff.post("/admin/schedules/schedule/", {"action": "pause", "_selected_action": [sched.pk]})

    sched.refresh_from_db()
    assert sched.state == "PAUSED"
    assert sched.events.filter(kind="paused", actor="support:admin").count() == 1


def test_occurrence_list_pages_by_keyset(client, alice, tenant_a):
    sched = schedule(tenant_a)
    now = timezone.now().replace(microsecond=0)
    made = [occurrence(sched, now - timedelta(minutes=i), state="SUCCEEDED") for i in range(55)]
    client.force_login(alice)

    first = client.get("/occurrences/")
    second = client.get("/occurrences/", {"after": first.context["next_cursor"]})

    ids = [r["occ"].id for r in first.context["occurrences"] + second.context["occurrences"]]
    assert (len(first.context["occurrences"]), len(second.context["occurrences"])) == (50, 5)
    assert ids == [o.id for o in made]
    assert second.context["next_cursor"] is None


def test_pages_answer_friendly_404_and_403(client, bob, tenant_a):
    client.force_login(bob)

    missing = client.get(f"/schedules/{uuid.uuid4()}/")
    refused = client.post("/dlq/replay/", {"ids": [str(uuid.uuid4())]})

    assert missing.status_code == 404 and b"another tenant" in missing.content
    assert refused.status_code == 403 and b"Viewers can see everything" in refused.content


def test_due_backlog_counts_pending_and_unmaterialized_per_minute(tenant_a, tenant_b):
    now = timezone.now().replace(second=30, microsecond=0)
    minute = now.replace(second=0) + timedelta(minutes=3)
    yearly = "0 0 1 7 *"  # holders of occurrences, never due inside the window
    occurrence(
        schedule(tenant_a, expression=yearly), minute + timedelta(seconds=5), state="SCHEDULED"
    )
    occurrence(schedule(tenant_b, expression=yearly), minute, state="SCHEDULED")
    schedule(tenant_a, expression=yearly, next_run_at=minute + timedelta(minutes=1))
    schedule(tenant_a, expression=yearly, next_run_at=now - timedelta(hours=1))  # overdue

    rows = dash.due_backlog(tenant=tenant_a, now=now)

    by_minute = {r["minute"]: (r["pending"], r["unmaterialized"]) for r in rows}
    assert by_minute[minute] == (1, 0)
    assert by_minute[minute + timedelta(minutes=1)] == (0, 1)
    assert rows[0]["unmaterialized"] == 1 and rows[0]["past"]
    assert sum(r["pending"] for r in rows) == 1
    # only the minutes holding work, each labelled
    assert [r["label"] for r in rows] == ["overdue", "due in 3 min", "due in 4 min"]


def test_replay_from_an_occurrence_page_returns_to_it_and_a_reload_replays_nothing(
    client, alice, tenant_a
):
    dead = dead_occurrence(tenant_a)
    client.force_login(alice)
    page = f"/occurrences/{dead.id}/"

    response = client.post("/dlq/replay/", {"ids": [str(dead.id)], "next": page})
    offsite = client.post("/dlq/replay/", {"ids": [str(dead.id)], "next": "https://evil.test/"})

    assert (response.status_code, response["Location"]) == (302, page)
    assert offsite["Location"] == "/dlq/"  # never redirected off the site
    shown = client.get(page).content.decode()
    assert "Replayed 1 occurrence:" in shown and "…." not in shown  # no double period
    # the second POST found it RETRY_WAIT already: nothing replayed twice
    assert "Replayed 0 occurrences. Not DEAD, left alone:" in shown
    assert state_of(dead) == "RETRY_WAIT"
    assert DispatchOutbox.objects.filter(lane="retry").count() == 1
