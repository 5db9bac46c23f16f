"""A schedule with a long failing history, for the "pages stay short" tests: 25 DEAD
occurrences in the last day, the latest replayed into 15 identical DNS failures, and a dozen
events (pauses and resumes)."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.utils import timezone

from apps.occurrences.models import Attempt, Occurrence
from apps.occurrences.schedule_changes import schedule_pause, schedule_resume
from apps.occurrences.tests.support.rows import occurrence, schedule
from apps.schedules.models import Schedule
from apps.tenants.models import Tenant

DNS_ERROR = "Could not resolve host hooks.example.invalid: Name or service not known"


def failing_schedule(tenant: Tenant) -> tuple[Schedule, Occurrence]:
    sched = schedule(tenant, name="nightly export", handler="webhook",
                     payload={"url": "https://hooks.example.invalid/x"})  # fmt: skip
    now = timezone.now()
    top = now.replace(minute=0, second=0, microsecond=0)
    latest = None
    for hours_ago in range(25, 0, -1):
        latest = occurrence(sched, top - timedelta(hours=hours_ago), state=Occurrence.State.DEAD)
        tries = 15 if hours_ago == 1 else 1
        Occurrence.objects.filter(id=latest.id).update(attempt_count=tries, finished_at=now)
        Attempt.objects.bulk_create(
            Attempt(
                scheduled_for=latest.scheduled_for, occurrence_id=latest.id, tenant_id=tenant.id,
                attempt_no=n, lease_token=uuid.uuid4(), lease_expires_at=now, worker_id="w",
                started_at=latest.scheduled_for + timedelta(seconds=n),
                finished_at=latest.scheduled_for + timedelta(seconds=n),
                outcome=Attempt.Outcome.FAILED, error_class="ConnectError",
                error_message=f"try {n}: {DNS_ERROR}",
            )
            for n in range(1, tries + 1)
        )  # fmt: skip
    for _ in range(6):
        schedule_pause(schedule=sched, actor="user:alice")
        schedule_resume(schedule=sched, actor="user:alice")
    sched.refresh_from_db()
    assert latest is not None
    return sched, latest
