"""Occurrence pages of the web UI: dashboard, occurrence list and detail, the DLQ with
replay. Same selectors and services as /api/v1/occurrences (apps/occurrences/api.py); every
list is bounded by a `scheduled_for` range (partition pruning) and keyset-paginated."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_POST

from apps.occurrences.execution.attempts import ReplayResult, occurrences_replay
from apps.occurrences.models import Attempt, Occurrence
from apps.occurrences.observability import dashboard as dash
from apps.occurrences.selectors import access_occurrence, attempts_of, occurrences_for
from apps.schedules.models import Schedule
from apps.schedules.views import decode_cursor, encode_cursor
from apps.tenants.views import TenantContext, admin_only, tenant_page

PAGE_SIZE = 50


def _tick(request: HttpRequest) -> TenantContext:
    return request.tick  # type: ignore[attr-defined, no-any-return]


def lag_s(occurrence: Occurrence) -> float | None:
    """enqueued_at - scheduled_for (flexible and retry lanes: - available_at), as the API."""
    if occurrence.enqueued_at is None:
        return None
    reference = (
        occurrence.available_at
        if occurrence.lane in ("flexible", "retry")
        else occurrence.scheduled_for
    )
    return round((occurrence.enqueued_at - reference).total_seconds(), 3)


@tenant_page
def dashboard(request: HttpRequest) -> HttpResponse:
    tenant = _tick(request).tenant
    now = timezone.now()
    points = dash.lag_percentiles(tenant=tenant, now=now, hours=6)
    by_state = dash.schedules_by_state(tenant=tenant)
    hour = dash.occurrences_by_state(tenant=tenant, since=now - timedelta(hours=1), until=now)
    day = dash.occurrences_by_state(tenant=tenant, since=now - timedelta(days=1), until=now)
    return render(request, "tick/dashboard.html", {
        "schedules_by_state": [(s, label, by_state.get(s, 0)) for s, label in
                               Schedule.State.choices],
        "occ_rows": [(s, label, hour.get(s, 0), day.get(s, 0))
                     for s, label in Occurrence.State.choices],
        "occ_any": bool(day), "retention_days": settings.TICK_RETENTION_DAYS,
        "lag_chart": dash.lag_chart_data(points), "lag_points": points,
        "backlog": dash.due_backlog(tenant=tenant, now=now),
        "dlq": dash.dlq_count(tenant=tenant, now=now),
        "quotas": dash.quota_usage(tenant=tenant, now=now), "now": now, "nav": "dashboard",
    })  # fmt: skip


def _parse_instant(value: str) -> datetime | None:
    parsed = parse_datetime(value.strip()) if value.strip() else None
    if parsed is not None and parsed.tzinfo is None:
        parsed = timezone.make_aware(parsed, timezone.get_current_timezone())
    return parsed


def _filtered(
    request: HttpRequest, *, forced_state: str | None, default_days: int, list_url: str
) -> dict[str, Any]:
    """Shared list logic: filters by state, schedule and time range, keyset pages."""
    tenant = _tick(request).tenant
    now = timezone.now()
    params = request.GET
    errors: list[str] = []
    since = _parse_instant(params.get("from", "")) if params.get("from") else None
    until = _parse_instant(params.get("to", "")) if params.get("to") else None
    if params.get("from") and since is None:
        errors.append("“From” must be a date and time like 2026-03-08T09:30 (UTC).")
    if params.get("to") and until is None:
        errors.append("“To” must be a date and time like 2026-03-08T10:30 (UTC).")
    since = since or now - timedelta(days=default_days)
    until = until or now + timedelta(hours=1)
    queryset = occurrences_for(tenant=tenant).filter(
        scheduled_for__gte=since, scheduled_for__lt=until
    )
    state = forced_state or params.get("state", "").upper()
    if state:
        if state in Occurrence.State.values:
            queryset = queryset.filter(state=state)
        else:
            errors.append(f"Unknown state {state!r}.")
            state = ""
    schedule_text = params.get("schedule", "").strip()
    if schedule_text:
        try:
            queryset = queryset.filter(schedule_id=uuid.UUID(schedule_text))
        except ValueError:
            errors.append("Schedule must be a schedule id (UUID).")
    cursor = decode_cursor(params["after"]) if params.get("after") else None
    if cursor is not None:
        at, row_id = cursor
        queryset = queryset.filter(scheduled_for__lte=at).exclude(scheduled_for=at, id__gte=row_id)
    rows = list(
        queryset.select_related("schedule").order_by("-scheduled_for", "-id")[: PAGE_SIZE + 1]
    )
    next_cursor = None
    if len(rows) > PAGE_SIZE:
        rows = rows[:PAGE_SIZE]
        next_cursor = encode_cursor(rows[-1].scheduled_for, rows[-1].id)
    query = params.copy()
    query.pop("after", None)
    return {
        "occurrences": [{"occ": o, "lag": lag_s(o)} for o in rows], "errors": errors,
        "since": since, "until": until, "state": state, "schedule": schedule_text,
        "next_cursor": next_cursor, "filters": query.urlencode(), "paged": cursor is not None,
        "from_value": params.get("from", ""), "to_value": params.get("to", ""),
        "list_url": list_url,
    }  # fmt: skip


@tenant_page
def occurrence_list(request: HttpRequest) -> HttpResponse:
    context = _filtered(
        request, forced_state=None, default_days=1, list_url=reverse("occurrence-list")
    )
    context.update(states=Occurrence.State.choices, nav="occurrences")
    return render(request, "tick/occurrence_list.html", context)


@tenant_page
def occurrence_detail(request: HttpRequest, occurrence_id: str) -> HttpResponse:
    try:
        parsed = uuid.UUID(occurrence_id)
    except ValueError:
        raise Http404("No such occurrence.") from None
    occurrence = access_occurrence(tenant=_tick(request).tenant, occurrence_id=parsed)
    return render(request, "tick/occurrence_detail.html", {
        "occ": occurrence, "attempts": list(attempts_of(occurrence)), "lag": lag_s(occurrence),
        "schedule": Schedule.objects.filter(tenant=_tick(request).tenant,
                                            id=occurrence.schedule_id).first(),
        "nav": "occurrences",
    })  # fmt: skip


def _last_errors(tenant_id: uuid.UUID, rows: list[Occurrence]) -> dict[uuid.UUID, Attempt]:
    """The last attempt of each occurrence, in one query (bounded by their instants)."""
    last: dict[uuid.UUID, Attempt] = {}
    if rows:
        for attempt in Attempt.objects.filter(
            tenant_id=tenant_id,
            occurrence_id__in=[o.id for o in rows],
            scheduled_for__in={o.scheduled_for for o in rows},
        ).order_by("attempt_no"):
            last[attempt.occurrence_id] = attempt
    return last


def _dlq_page(
    request: HttpRequest, result: ReplayResult | None = None, status: int = 200
) -> HttpResponse:
    context = _filtered(
        request, forced_state=Occurrence.State.DEAD, default_days=settings.TICK_RETENTION_DAYS,
        list_url=reverse("dlq"),
    )  # fmt: skip
    last = _last_errors(_tick(request).tenant.id, [r["occ"] for r in context["occurrences"]])
    for row in context["occurrences"]:
        row["last"] = last.get(row["occ"].id)
    context.update(result=result, nav="dlq")
    return render(request, "tick/dlq.html", context, status=status)


@tenant_page
def dlq(request: HttpRequest) -> HttpResponse:
    return _dlq_page(request)


@tenant_page
@require_POST
def dlq_replay(request: HttpRequest) -> HttpResponse:
    """Replay the selected DEAD occurrences (same id, retry lane) and show what happened.
    Another tenant's id is reported as not found, exactly like a missing one."""
    admin_only(request)
    ids: list[uuid.UUID] = []
    for value in request.POST.getlist("ids")[:500]:
        try:
            ids.append(uuid.UUID(value))
        except ValueError:
            continue
    if not ids:
        return _dlq_page(request, status=400)
    result = occurrences_replay(tenant_id=_tick(request).tenant.id, occurrence_ids=ids)
    return _dlq_page(request, result=result)
