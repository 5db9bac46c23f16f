"""A backfill or a run now never makes a schedule look late (docs/ui.md "Asked-for runs are
never late"): the runs come from the real services, are claimed by the engine, then read back
through the pages, the API, the dashboard's lag and a lag alert rule."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from apps.occurrences.alerts.lag import lag_alerts_record
from apps.occurrences.alerts.tests.support import channel, rule
from apps.occurrences.execution.claim import ClaimStatus, occurrence_claim
from apps.occurrences.manual_runs import BackfillOnly, schedule_backfill, schedule_run_now
from apps.occurrences.models import Alert, AlertEvent, Occurrence
from apps.occurrences.observability.dashboard import start_lag_percentiles
from apps.occurrences.tests.support.rows import occurrence, schedule

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 3, 9, 30, 20, tzinfo=UTC)


def _backfilled_every_minute(tenant):
    """An every-minute schedule whose last half hour was backfilled just now: 30 catch-up
    runs with instants up to 30 min in the past, none started yet."""
    sched = schedule(tenant, name="minutely", expression="* * * * *")
    receipt = schedule_backfill(
        schedule=sched, actor="user:alice", start=NOW.replace(second=0) - timedelta(minutes=30),
        end=NOW.replace(second=0), only=BackfillOnly.MISSED, now=NOW,
    )  # fmt: skip
    assert receipt.queued == 30
    return sched


@time_machine.travel(NOW, tick=False)
def test_a_backfill_makes_no_late_badge_and_no_past_next_run(client, alice, tenant_a):
    sched = _backfilled_every_minute(tenant_a)
    overdue = schedule(tenant_a, name="really late")  # the filter still finds a real one
    occurrence(overdue, NOW - timedelta(minutes=5), state=Occurrence.State.ENQUEUED)
    client.force_login(alice)

    listed = client.get("/schedules/").content.decode()
    late = client.get("/schedules/?health=late").content.decode()
    detail = client.get(f"/schedules/{sched.id}/").content.decode()

    row = re.search(
        r"<tr data-schedule=[^>]*>\s*(?:<td><input [^>]*></td>)?\s*"
        r"<td><a [^>]*>minutely</a>.*?</tr>",
        listed,
        re.S,
    )
    assert row is not None and "flag-late" not in row.group(0)
    assert ">really late</a>" in late and ">minutely</a>" not in late
    # the timetable's next instant (09:31), not the oldest backfilled one (09:00)
    next_run = re.search(r'<dd id="next-run">(.*?)</dd>', detail)
    assert next_run is not None and next_run.group(1) == "2026-12-03 09:31:00 UTC"


@time_machine.travel(NOW, tick=False)
def test_backfilled_runs_started_now_count_their_lag_from_the_request(api_a, tenant_a):
    sched = _backfilled_every_minute(tenant_a)
    first = Occurrence.objects.filter(schedule=sched).order_by("scheduled_for").first()
    assert first is not None
    assert first.scheduled_for == NOW.replace(second=0) - timedelta(minutes=30)
    claim = occurrence_claim(
        occurrence_id=first.id, scheduled_for=first.scheduled_for, worker_id="w",
        now=NOW + timedelta(seconds=2),
    )  # fmt: skip
    assert claim.status == ClaimStatus.CLAIMED

    body = api_a.get(f"/api/v1/occurrences/{first.id}").json()
    listed = api_a.get(f"/api/v1/schedules/{sched.id}").json()

    assert body["origin"] == "backfill" and body["start_lag_s"] == 2.0  # not 1,802 s
    assert listed["next_run_at"] == "2026-12-03T09:31:00Z"


@time_machine.travel(NOW, tick=False)
def test_no_lag_alert_and_no_dashboard_lag_from_asked_for_runs(tenant_a):
    # a lag rule over 3 minutes: every one of them holds a backfilled instant never started
    rule(channel(tenant_a, "ops@example.com"), AlertEvent.START_LAG, threshold_s=30,
         window_minutes=3)  # fmt: skip
    sched = _backfilled_every_minute(tenant_a)
    # a run now asked 5 minutes ago on the strict lane, started only now
    receipt = schedule_run_now(
        schedule=sched, actor="user:alice", request_id="r-1", now=NOW - timedelta(minutes=5)
    )
    claim = occurrence_claim(
        occurrence_id=receipt.occurrence, scheduled_for=NOW - timedelta(minutes=5),
        worker_id="w", now=NOW,
    )  # fmt: skip
    assert claim.status == ClaimStatus.CLAIMED

    assert lag_alerts_record(now=NOW) == 0
    assert not Alert.objects.filter(tenant=tenant_a).exists()
    assert start_lag_percentiles(tenant=tenant_a, now=NOW + timedelta(minutes=1)) == []


@time_machine.travel(NOW, tick=False)
def test_a_late_timetable_run_still_fires_the_lag_rule(tenant_a):
    # the control: the same rule fires on the timetable's own runs left waiting
    rule(channel(tenant_a, "ops@example.com"), AlertEvent.START_LAG, threshold_s=30,
         window_minutes=3)  # fmt: skip
    sched = schedule(tenant_a, name="minutely", expression="* * * * *")
    minute = NOW.replace(second=0)
    for n in range(1, 4):
        occurrence(sched, minute - timedelta(minutes=n))

    assert lag_alerts_record(now=NOW) == 1
