"""Tenant-scoped reads: the one door through which tenant code reaches schedules."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from django.db.models import QuerySet
from django.http import Http404

from apps.schedules.models import Schedule
from apps.tenants.models import Tenant


def schedules_for(*, tenant: Tenant) -> QuerySet[Schedule]:
    return Schedule.objects.filter(tenant=tenant)


def access_schedule(*, tenant: Tenant, schedule_id: uuid.UUID | str) -> Schedule:
    """The tenant's schedule, or 404 — also for another tenant's id (never 403, never data)
    and for an id that is no UUID at all (a malformed web path is a page that does not exist,
    never a 500: the id is parsed here, before the query)."""
    try:
        parsed = schedule_id if isinstance(schedule_id, uuid.UUID) else uuid.UUID(schedule_id)
        return schedules_for(tenant=tenant).get(id=parsed)
    except (Schedule.DoesNotExist, ValueError, TypeError, AttributeError):
        raise Http404("No such schedule.") from None


def schedules_filtered(
    *,
    tenant: Tenant,
    state: str | None = None,
    kind: str | None = None,
    handler: str | None = None,
    q: str | None = None,
    label: Sequence[tuple[str, str]] | None = None,
) -> QuerySet[Schedule]:
    """The tenant's schedules for the list endpoint. Each filter has an index that keeps
    keyset pages (newest first, `(created_at, id)` cursor) cheap at 20M rows: state →
    schedule_tenant_state_idx, handler → schedule_tenant_handler_idx, q → the trigram index;
    kind has two values, so its filter rides on schedule_tenant_list_idx; each label
    (`key`, `value`) is one `labels @> {key: value}` through schedule_labels_idx, all of them
    required (docs/performance.md "Label filters")."""
    queryset = schedules_for(tenant=tenant)
    if state:
        queryset = queryset.filter(state=state.upper())
    if kind:
        queryset = queryset.filter(kind=kind.upper())
    if handler:
        queryset = queryset.filter(handler=handler)
    if q:
        queryset = queryset.filter(name__icontains=q)
    for key, value in label or ():
        queryset = queryset.filter(labels__contains={key: value})
    if label:
        # Implied by any pair, and the predicate of the partial schedule_labels_idx: without
        # it the planner cannot use the index.
        queryset = queryset.exclude(labels={})
    return queryset
