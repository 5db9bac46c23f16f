"""Tenant-scoped reads of occurrences and their attempts."""

from __future__ import annotations

import uuid

from django.db.models import QuerySet
from django.http import Http404

from apps.occurrences.models import Attempt, Occurrence
from apps.tenants.models import Tenant


def occurrences_for(*, tenant: Tenant) -> QuerySet[Occurrence]:
    return Occurrence.objects.filter(tenant=tenant)


def access_occurrence(*, tenant: Tenant, occurrence_id: uuid.UUID | str) -> Occurrence:
    """The tenant's occurrence, or 404 — also for another tenant's id."""
    occurrence = occurrences_for(tenant=tenant).filter(id=occurrence_id).first()
    if occurrence is None:
        raise Http404("No such occurrence.")
    return occurrence


def attempts_of(occurrence: Occurrence) -> QuerySet[Attempt]:
    return Attempt.objects.filter(
        occurrence_id=occurrence.id,
        scheduled_for=occurrence.scheduled_for,
        tenant_id=occurrence.tenant_id,
    ).order_by("attempt_no")
