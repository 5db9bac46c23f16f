"""Rows for tests that work below the materializer: schedules, and occurrences at chosen
instants in chosen states, written directly."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from apps.occurrences.models import Attempt, Lane, Occurrence, occurrence_id_for
from apps.occurrences.pipeline.partitions import partitions_ensure
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule
from apps.tenants.models import Tenant


def schedule(tenant: Tenant, **fields: Any) -> Schedule:
    """`make_schedule` with an hourly rule by default, so that at most one instant of it falls
    due by itself while a test runs (when an hour turns: a test that materializes picks its
    own occurrences by schedule and instant, docs/testing.md), and the longest max lateness,
    so that occurrences written minutes in the past are claimed as due, not judged by the
    misfire policy."""
    return make_schedule(
        tenant, **{"expression": "0 * * * *", "max_lateness_s": 7 * 86400, **fields}
    )


def occurrence(
    sched: Schedule, scheduled_for: datetime, *, state: str = Occurrence.State.ENQUEUED
) -> Occurrence:
    partitions_ensure([scheduled_for.date()])
    return Occurrence.objects.create(
        id=occurrence_id_for(sched.id, sched.version, scheduled_for),
        scheduled_for=scheduled_for,
        schedule=sched,
        schedule_version=sched.version,
        tenant_id=sched.tenant_id,
        lane=Lane.STRICT,
        state=state,
        available_at=scheduled_for,
        created_at=timezone.now(),
    )


def state_of(occ: Occurrence) -> str:
    return str(
        Occurrence.objects.filter(id=occ.id, scheduled_for=occ.scheduled_for)
        .values_list("state", flat=True)
        .get()
    )


def dead_occurrence(tenant: Tenant, minutes_ago: int = 1, error: str = "HTTP 503") -> Occurrence:
    """A DEAD occurrence of a new schedule, with its one FAILED attempt carrying `error`."""
    occ = occurrence(
        schedule(tenant),
        timezone.now() - timedelta(minutes=minutes_ago),
        state=Occurrence.State.DEAD,
    )
    Occurrence.objects.filter(id=occ.id).update(attempt_count=1, finished_at=timezone.now())
    Attempt.objects.create(
        scheduled_for=occ.scheduled_for, occurrence_id=occ.id, tenant_id=tenant.id, attempt_no=1,
        lease_token=uuid.uuid4(), lease_expires_at=timezone.now(), worker_id="w",
        started_at=timezone.now(), finished_at=timezone.now(), outcome=Attempt.Outcome.FAILED,
        error_class="PermanentError", error_message=error,
    )  # fmt: skip
    return occ


def attempt_started(
    occ: Occurrence,
    started_at: datetime,
    *,
    attempt_no: int = 1,
    outcome: str = Attempt.Outcome.SUCCEEDED,
) -> Attempt:
    """Attempt `attempt_no` of `occ`, opened at `started_at` and finished with `outcome`."""
    Occurrence.objects.filter(id=occ.id).update(attempt_count=attempt_no)
    return Attempt.objects.create(
        scheduled_for=occ.scheduled_for, occurrence_id=occ.id, tenant_id=occ.tenant_id,
        attempt_no=attempt_no, lease_token=uuid.uuid4(), lease_expires_at=started_at,
        worker_id="w", started_at=started_at, finished_at=started_at, outcome=outcome,
    )  # fmt: skip
