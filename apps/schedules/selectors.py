"""Tenant-scoped reads: the one door through which tenant code reaches schedules."""

from __future__ import annotations

import uuid

from django.db.models import QuerySet
from django.http import Http404

from apps.schedules.models import Schedule
from apps.tenants.models import Tenant


def schedules_for(*, tenant: Tenant) -> QuerySet[Schedule]:
    return Schedule.objects.filter(tenant=tenant)


def access_schedule(*, tenant: Tenant, schedule_id: uuid.UUID | str) -> Schedule:
    """The tenant's schedule, or 404 — also for another tenant's id (never 403, never data)."""
    try:
        return schedules_for(tenant=tenant).get(id=schedule_id)
    except (Schedule.DoesNotExist, ValueError, TypeError):
        raise Http404("No such schedule.") from None
