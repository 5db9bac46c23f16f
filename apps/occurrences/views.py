"""Occurrence pages of the web UI: dashboard, occurrence list and detail, the DLQ with
replay. Same selectors and services as /api/v1/occurrences (apps/occurrences/api.py); every
list is bounded by a `scheduled_for` range (partition pruning) and keyset-paginated."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from apps.core.pagination import web_page
from apps.occurrences.execution.replay import ReplayResult, occurrences_replay
from apps.occurrences.models import Attempt, Occurrence
from apps.occurrences.observability import dashboard as dash
from apps.occurrences.selectors import (
    LAG_FROM_AVAILABLE_AT,
    OccurrenceFilterError,
    access_occurrence,
    attempts_of,
    enqueue_lag_s,
    occurrences_filtered,
    parse_occurrence_filter,
    start_lag_s,
)
from apps.schedules.models import Schedule
from apps.tenants.page_lists import page_list
from apps.tenants.web import admin_only, tenant_page, tick_of

PAGE_SIZE = 50
FILTER_LABELS = {"schedule": "Schedule", "state": "State", "from": "From", "to": "To"}


@tenant_page
def dashboard(request: HttpRequest) -> HttpResponse:
    tenant = tick_of(request).tenant
    now = timezone.now()
    points = dash.lag_percentiles(tenant=tenant, now=now, hours=6)
    start_points = dash.start_lag_percentiles(tenant=tenant, now=now, hours=6)
    by_state = dash.schedules_by_state(tenant=tenant)
    hour = dash.occurrences_by_state(tenant=tenant, since=now - timedelta(hours=1), until=now)
    day = dash.occurrences_by_state(tenant=tenant, since=now - timedelta(days=1), until=now)
    return render(request, "tick/dashboard.html", {
        "schedules_by_state": [(s, label, by_state.get(s, 0)) for s, label in
                               Schedule.State.choices],
        "occ_rows": [(s, label, hour.get(s, 0), day.get(s, 0))
                     for s, label in Occurrence.State.choices],
        "occ_any": bool(day), "retention_days": settings.TICK_RETENTION_DAYS,
        # With schedules but no run yet (a new tenant, the demo): when the first one is due,
        # not "create a schedule".
        "schedules_any": any(by_state.values()), "active_count": by_state.get(
            Schedule.State.ACTIVE, 0), "next_due": dash.next_due(tenant=tenant, now=now),
        "lag_chart": dash.lag_chart_data(points), "lag_points": points,
        "start_lag_chart": dash.lag_chart_data(start_points), "start_lag_points": start_points,
        "backlog": dash.due_backlog(tenant=tenant, now=now),
        "dlq": dash.dlq_count(tenant=tenant, now=now),
        "quotas": dash.quota_usage(tenant=tenant, now=now), "now": now, "nav": "dashboard",
    })  # fmt: skip


def _filtered(
    request: HttpRequest,
    *,
    only_state: Occurrence.State | None,
    default_days: int,
    list_url: str,
) -> dict[str, Any]:
    """Shared list logic: the API's filters, a bounded time range, keyset pages. Filters that
    cannot be understood list nothing and say why (the API answers 400)."""
    now = timezone.now()
    params = request.GET
    context: dict[str, Any] = {
        "occurrences": [], "errors": [], "next_cursor": None, "paged": False, "filters": "",
        "since": now - timedelta(days=default_days), "until": now + timedelta(hours=1),
        "state": only_state or params.get("state", "").strip(),
        "schedule": params.get("schedule", "").strip(), "from_value": params.get("from", ""),
        "to_value": params.get("to", ""), "list_url": list_url,
    }  # fmt: skip
    try:
        filters = parse_occurrence_filter(params, naive_as_utc=True).bounded(
            since=context["since"], until=context["until"]
        )
    except OccurrenceFilterError as err:
        context["errors"] = [f"{FILTER_LABELS[name]}: {text}" for name, text in err.errors.items()]
        return context
    queryset = occurrences_filtered(
        tenant=tick_of(request).tenant, filters=filters, only_state=only_state
    )
    page = web_page(
        request, queryset.select_related("schedule"), field="scheduled_for", size=PAGE_SIZE
    )
    context.update(page.pager(), since=filters.since, until=filters.until)
    context["occurrences"] = [
        {"occ": o, "lag": enqueue_lag_s(o), "start_lag": start_lag_s(o)} for o in page.rows
    ]
    context["errors"] = [page.error] if page.error else []
    return context


@tenant_page
def occurrence_list(request: HttpRequest) -> HttpResponse:
    context = _filtered(
        request, only_state=None, default_days=1, list_url=reverse("occurrence-list")
    )
    context.update(states=Occurrence.State.choices, nav="occurrences")
    return render(request, "tick/occurrence_list.html", context)


@tenant_page
def occurrence_detail(request: HttpRequest, occurrence_id: str) -> HttpResponse:
    try:
        parsed = uuid.UUID(occurrence_id)
    except ValueError:
        raise Http404("No such occurrence.") from None
    tenant = tick_of(request).tenant
    occurrence = access_occurrence(tenant=tenant, occurrence_id=parsed)
    return render(request, "tick/occurrence_detail.html", {
        "occ": occurrence,
        # The latest first: a replayed occurrence may hold dozens of identical failures.
        "attempts": page_list(request, "attempts", attempts_of(occurrence).reverse()),
        "lag": enqueue_lag_s(occurrence), "start_lag": start_lag_s(occurrence),
        "lag_from": "available" if occurrence.lane in LAG_FROM_AVAILABLE_AT else "scheduled",
        "schedule": Schedule.objects.filter(tenant=tenant, id=occurrence.schedule_id).first(),
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


def _dlq_page(request: HttpRequest) -> HttpResponse:
    context = _filtered(
        request, only_state=Occurrence.State.DEAD, default_days=settings.TICK_RETENTION_DAYS,
        list_url=reverse("dlq"),
    )  # fmt: skip
    last = _last_errors(tick_of(request).tenant.id, [r["occ"] for r in context["occurrences"]])
    for row in context["occurrences"]:
        row["last"] = last.get(row["occ"].id)
    context.update(nav="dlq")
    return render(request, "tick/dlq.html", context)


@tenant_page
def dlq(request: HttpRequest) -> HttpResponse:
    return _dlq_page(request)


def _short(ids: Iterable[uuid.UUID]) -> str:
    return ", ".join(f"{str(i)[:8]}…" for i in ids)


def replay_summary(result: ReplayResult) -> str:
    """What a replay did, in one message: replayed, left alone (with their state), not found."""
    # Ids are shortened with "…": a sentence ending in one takes no period after it ("….").
    parts = [f"Replayed {len(result.replayed)} occurrence{pluralize(len(result.replayed))}"
             + (f": {_short(result.replayed)}" if result.replayed else ".")]  # fmt: skip
    if result.not_dead:
        states = ", ".join(f"{str(i)[:8]}… ({st})" for i, st in result.not_dead.items())
        parts.append(f"Not DEAD, left alone: {states}.")
    if result.not_found:
        parts.append(f"Not found: {len(result.not_found)}.")
    return " ".join(parts)


@tenant_page
@require_POST
def dlq_replay(request: HttpRequest) -> HttpResponse:
    """Replay the selected DEAD occurrences (same id, retry lane), then redirect (POST,
    redirect, GET: a reload does not replay again) to the page the form came from — the DLQ
    or an occurrence — with what happened as a message. Another tenant's id is reported as
    not found, exactly like a missing one."""
    admin_only(request)
    ids: list[uuid.UUID] = []
    for value in request.POST.getlist("ids")[:500]:
        try:
            ids.append(uuid.UUID(value))
        except ValueError:
            continue
    back = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(
        back, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        back = reverse("dlq")
    if not ids:
        messages.error(request, "Select at least one occurrence to replay.")
        return redirect(back)
    result = occurrences_replay(tenant_id=tick_of(request).tenant.id, occurrence_ids=ids)
    level = messages.SUCCESS if result.replayed else messages.WARNING
    messages.add_message(request, level, replay_summary(result))
    return redirect(back)
