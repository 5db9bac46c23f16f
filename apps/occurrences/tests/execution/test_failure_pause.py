"""Pause after N consecutive DEAD occurrences: a webhook answering 410 five times in a row
pauses its schedule (actor `tick`, the reason in the event, an alert for the tenant's rule);
a success in between resets the count, resume clears it, the setting off counts nothing."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.occurrences.execution.run import occurrence_execute
from apps.occurrences.failure_pause import failing_schedules_pause
from apps.occurrences.models import Alert, AlertChannel, AlertEvent, AlertRule, Occurrence
from apps.occurrences.schedule_changes import schedule_resume
from apps.occurrences.tests.execution import test_webhook_signing
from apps.occurrences.tests.support.rows import occurrence, schedule, state_of
from apps.schedules.models import Schedule, ScheduleEvent
from apps.tenants.models import Tenant

# The local webhook receiver (a fixture answering the statuses a test lists).
receiver = test_webhook_signing.receiver

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("partitions_around_today")]


def _webhook_schedule(tenant: Tenant, receiver: Any, **fields: Any) -> Schedule:
    tenant.webhook_allowed_ports = [receiver.server_port]
    tenant.save(update_fields=["webhook_allowed_ports"])
    url = f"http://127.0.0.1:{receiver.server_port}/hook"
    return schedule(tenant, handler="webhook", payload={"url": url}, **fields)


def _run(sched: Schedule, minutes_ago: int, receiver: Any, status: int) -> Occurrence:
    occ = occurrence(sched, timezone.now() - timedelta(minutes=minutes_ago))
    receiver.statuses = [status]
    occurrence_execute(occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w")
    return occ


def test_five_410s_in_a_row_pause_the_schedule_with_its_reason_and_alert(
    receiver,
    tenant_a,
):
    channel = AlertChannel.objects.create(
        tenant=tenant_a, name="ops", kind=AlertChannel.Kind.WEBHOOK,
        target="https://example.com/alerts", confirmed_at=timezone.now(),
    )  # fmt: skip
    AlertRule.objects.create(
        tenant=tenant_a, channel=channel, event=AlertEvent.SCHEDULE_PAUSED_FAILING
    )
    sched = _webhook_schedule(tenant_a, receiver, pause_after_dead=5)

    for n in range(4):
        assert state_of(_run(sched, 50 - n, receiver, 410)) == Occurrence.State.DEAD
    assert failing_schedules_pause() == 0
    _run(sched, 40, receiver, 410)
    sched.refresh_from_db()
    assert sched.dead_streak == 5 and sched.state == Schedule.State.ACTIVE

    assert failing_schedules_pause() == 1

    sched.refresh_from_db()
    assert sched.state == Schedule.State.PAUSED
    event = ScheduleEvent.objects.filter(schedule=sched, kind=ScheduleEvent.Kind.PAUSED).get()
    assert event.actor == "tick"
    assert event.detail["reason"] == "5 consecutive DEAD occurrences (pause after 5)"
    alert = Alert.objects.get(schedule_id=sched.id)
    assert alert.event == AlertEvent.SCHEDULE_PAUSED_FAILING
    assert alert.subject.startswith("PAUSED: ")
    assert failing_schedules_pause() == 0  # paused once

    schedule_resume(schedule=sched, actor="user:alice")
    sched.refresh_from_db()
    assert sched.state == Schedule.State.ACTIVE and sched.dead_streak == 0


def test_a_success_in_between_resets_the_count(receiver, tenant_a):
    sched = _webhook_schedule(tenant_a, receiver, pause_after_dead=3)

    _run(sched, 50, receiver, 410)
    _run(sched, 49, receiver, 410)
    _run(sched, 48, receiver, 200)
    _run(sched, 47, receiver, 410)

    sched.refresh_from_db()
    assert sched.dead_streak == 1
    assert failing_schedules_pause() == 0


def test_off_by_default_counts_nothing_and_the_tenant_default_applies(
    receiver,
    tenant_a,
):
    sched = _webhook_schedule(tenant_a, receiver)
    for n in range(3):
        _run(sched, 50 - n, receiver, 410)
    sched.refresh_from_db()
    assert sched.pause_after_dead == 0 and sched.dead_streak == 0

    Tenant.objects.filter(pk=tenant_a.pk).update(pause_after_dead=7)
    tenant_a.refresh_from_db()
    assert schedule(tenant_a, name="new").pause_after_dead == 7


def test_the_api_sets_it_and_the_page_says_why_paused(api_a, client, alice, tenant_a):
    created = api_a.post("/api/v1/schedules", {
        "name": "r", "kind": "cron", "expression": "0 3 * * *", "handler": "noop",
        "pause_after_dead": 4,
    }, format="json")  # fmt: skip
    assert created.status_code == 201, created.content
    assert created.json()["pause_after_dead"] == 4 and created.json()["dead_streak"] == 0
    sched = Schedule.objects.get(id=created.json()["id"])
    Schedule.objects.filter(pk=sched.pk).update(dead_streak=4)
    failing_schedules_pause()

    client.force_login(alice)
    page = client.get(f"/schedules/{sched.id}/").content.decode()

    assert 'id="paused-why"' in page and "by tick: 4 consecutive DEAD occurrences" in page
    changed = api_a.patch(f"/api/v1/schedules/{sched.id}", {"pause_after_dead": 0}, format="json")
    assert changed.json()["schedule"]["pause_after_dead"] == 0
    assert changed.json()["schedule"]["version"] == 1
