"""Plain factories for schedules in tests."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import F

from apps.schedules.models import Schedule
from apps.schedules.services import ScheduleSpec, schedule_create
from apps.tenants.models import Tenant


def make_schedule(
    tenant: Tenant, *, next_run_at: datetime | None = None, **overrides: Any
) -> Schedule:
    """A schedule created through the service; `next_run_at` may be forced (e.g. into the
    past, to play an outage) after creation."""
    fields: dict[str, Any] = {
        "name": "test schedule",
        "kind": Schedule.Kind.CRON,
        "expression": "* * * * *",
        "time_zone": "UTC",
        "handler": "record",
    }
    fields.update(overrides)
    schedule = schedule_create(tenant=tenant, spec=ScheduleSpec(**fields), actor="test")
    if next_run_at is not None:
        Schedule.objects.filter(pk=schedule.pk).update(
            next_run_at=next_run_at, version=F("version")
        )
        schedule.refresh_from_db()
    return schedule
