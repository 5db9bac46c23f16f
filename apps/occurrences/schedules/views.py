"""Schedule pages of the web UI: thin views over the same selectors, serializers and services
as /api/v1/schedules (api.py beside it). Every id goes through `access_schedule` with the
signed-in user's current tenant: another tenant's id is a 404. Changes are admins' only."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_POST

from apps.core.pagination import (
    WEB_CURSOR,
    InvalidCursor,
    Position,
    decode_cursor,
    encode_cursor,
    web_page,
)
from apps.occurrences.manual_runs import (
    BackfillReceipt,
    BackfillTooLarge,
    RunNowReceipt,
    backfill_instants,
    schedule_backfill,
    schedule_run_now,
)
from apps.occurrences.models import Attempt, Lane, Occurrence
from apps.occurrences.schedule_changes import (
    LifecycleResult,
    schedule_cancel,
    schedule_pause,
    schedule_resume,
    schedule_update,
)
from apps.occurrences.schedule_health import (
    FAILING_BELOW,
    HEALTH_WINDOW,
    LATE_AFTER,
    RATE_OVER,
    HealthFilter,
    ScheduleHealth,
    schedules_health,
    schedules_health_scan,
)
from apps.occurrences.schedules.forms import (
    ScheduleForm,
    validated_create,
    validated_draft,
    validated_update,
    zone_names,
)
from apps.occurrences.schedules.serializers import (
    KIND_IN,
    BackfillRequestSerializer,
    RunNowRequestSerializer,
    schedule_as_input,
)
from apps.occurrences.selectors import next_runs_shown, occurrences_for, upcoming_runs
from apps.schedules.errors import LifecycleError
from apps.schedules.labels import LabelError, labels_text, parse_label_filter
from apps.schedules.models import Schedule, ScheduleEvent, ScheduleVersion
from apps.schedules.rule_words import cron_in_words, schedule_in_words
from apps.schedules.selectors import access_schedule, schedules_filtered
from apps.schedules.services import (
    schedule_create,
    schedule_dst_changes,
    schedule_preview,
    schedule_preview_instants,
)
from apps.schedules.timerules import TimeRuleError, interval_rule_words
from apps.tenants.page_lists import PageList, page_list
from apps.tenants.web import actor_of, admin_only, tenant_page, tick_of

PAGE_SIZE = 25
# The list's select-many action (apps/occurrences/schedules/bulk_views.py; the API's verbs).
BULK_VERBS = [("pause", "Pause"), ("resume", "Resume"), ("cancel", "Cancel"),
              ("run_now", "Run now")]  # fmt: skip
# The schedule page's recent occurrences after "Show more" (10 before); the rest are on the
# occurrence list, filtered to the schedule.
RECENT_OCCURRENCES = 100
# Recent occurrences are read from this window of day partitions only.
RECENT_WINDOW = timedelta(days=7)


@tenant_page
def schedule_list(request: HttpRequest) -> HttpResponse:
    """Newest first, keyset pages on (created_at, id): the API's filters and indexes. Each
    row carries its health (apps/occurrences/schedule_health.py), read for the page in one
    query; the "failing" / "late" filters scan a bounded number of schedules per request."""
    params = request.GET
    state = params.get("state", "").upper()
    kind = params.get("kind", "").lower()  # any case, as the API reads it
    q = params.get("q", "").strip()
    handler = params.get("handler", "").strip()
    health_text = params.get("health", "").lower()
    errors = []
    if state and state not in Schedule.State.values:
        errors.append(f"Unknown state {state!r}.")
        state = ""
    if kind and kind not in KIND_IN:
        errors.append(f"Unknown kind {kind!r}.")
        kind = ""
    if q and len(q) < 3:
        errors.append("Search needs at least 3 characters.")
        q = ""
    want = next((h for h in HealthFilter if h.value == health_text), None)
    if health_text and want is None:
        errors.append(f"Unknown health filter {health_text!r}.")
    label_filters, labels = [], []  # as typed (kept in the inputs), and parsed
    for text in filter(None, (t.strip() for t in params.getlist("label"))):
        try:
            labels.append(parse_label_filter(text))
        except LabelError as err:
            errors.append(err.message)
            continue
        label_filters.append(text)
    queryset = schedules_filtered(
        tenant=tick_of(request).tenant, state=state or None, kind=kind or None,
        handler=handler or None, q=q or None, label=labels,
    )  # fmt: skip
    now = timezone.now()
    scanned = None
    if want is None:
        page = web_page(request, queryset, field="created_at", size=PAGE_SIZE)
        schedules, pager, page_error = page.rows, page.pager(), page.error
        health = schedules_health(schedules, now=now)
        rows = [(s, health[s.id]) for s in schedules]
    else:
        rows, pager, page_error, scanned = _health_page(request, queryset, want, now)
        schedules = [s for s, _ in rows]
    # The API's "next run" (docs/api.md), read for the whole page in one query.
    next_runs = next_runs_shown(schedules, now=now)
    return render(request, "tick/schedule_list.html", {
        "schedules": schedules,
        "rows": [(s, h, next_runs[s.id], schedule_in_words(s)) for s, h in rows],
        **pager, "state": state, "kind": kind, "q": q, "handler": handler,
        "label_filters": label_filters, "bulk_verbs": BULK_VERBS,
        "health": want.value if want else "", "scanned": scanned, "now": now,
        # Created within the health window without a run yet: "new", not "no run in 7 days".
        "health_since": now - HEALTH_WINDOW,
        "errors": errors + ([page_error] if page_error else []),
        "states": Schedule.State.choices, "nav": "schedules", "rate_over": RATE_OVER,
        "failing_below": round(FAILING_BELOW * 100),
        "late_after_s": int(LATE_AFTER.total_seconds()),
    })  # fmt: skip


def _health_page(
    request: HttpRequest, queryset: QuerySet[Schedule], want: HealthFilter, now: datetime
) -> tuple[list[tuple[Schedule, ScheduleHealth]], dict[str, Any], str | None, int]:
    """A page of schedules matching a health filter: the scan resumes after the `after`
    cursor and stops at SCAN_BUDGET schedules; "search on" continues from where it stopped."""
    query = request.GET.copy()
    cursor = query.pop(WEB_CURSOR, [None])[0]
    pager = {"next_cursor": None, "paged": cursor is not None, "filters": query.urlencode()}
    after = None
    if cursor:
        try:
            position = decode_cursor(cursor)
        except InvalidCursor as err:
            return [], pager, str(err), 0
        after = (position.at, position.row_id)
    scan = schedules_health_scan(queryset, want=want, after=after, size=PAGE_SIZE, now=now)
    if scan.resume_after is not None:
        pager["next_cursor"] = encode_cursor(Position(*scan.resume_after))
    return scan.rows, pager, None, scan.scanned


def _version_changes(versions: list[ScheduleVersion]) -> list[dict[str, Any]]:
    rows = []
    previous: dict[str, Any] | None = None
    for version in versions:
        definition = version.definition or {}
        changed = []
        if previous is not None:
            for key in sorted(set(definition) | set(previous)):
                if definition.get(key) != previous.get(key):
                    changed.append((key, previous.get(key), definition.get(key)))
        rows.append({"version": version, "changed": changed})
        previous = definition
    return list(reversed(rows))


def _recent_occurrences(request: HttpRequest, schedule: Schedule, now: datetime) -> PageList:
    """The schedule's latest occurrences, each with its attempt count and last attempt (one
    query for the page's rows: the attempts themselves are on the occurrence's page)."""
    recent = page_list(request, "recent", (
        occurrences_for(tenant=schedule.tenant)
        .filter(
            schedule_id=schedule.id,
            scheduled_for__gte=now - RECENT_WINDOW,
            scheduled_for__lt=now + timedelta(days=1),
        )
        .order_by("-scheduled_for", "-id")
    ), expanded_cap=RECENT_OCCURRENCES)  # fmt: skip
    last: dict[uuid.UUID, Attempt] = {}
    if recent.rows:
        for attempt in (
            Attempt.objects.filter(
                tenant_id=schedule.tenant_id,
                occurrence_id__in=[o.id for o in recent.rows],
                scheduled_for__in={o.scheduled_for for o in recent.rows},
            )
            .order_by("occurrence_id", "scheduled_for", "-attempt_no")
            .distinct("occurrence_id", "scheduled_for")
        ):
            last[attempt.occurrence_id] = attempt
    rows = [{"occ": o, "last": last.get(o.id)} for o in recent.rows]
    return PageList(recent.name, rows, recent.more, recent.expanded)


# How many next fires a schedule's page lists.
DETAIL_FIRES = 10


def _detail(
    request: HttpRequest,
    schedule: Schedule,
    *,
    result: LifecycleResult | None = None,
    manual: RunNowReceipt | BackfillReceipt | None = None,
    status: int = 200,
) -> HttpResponse:
    now = timezone.now()
    versions = list(ScheduleVersion.objects.filter(schedule=schedule).order_by("version"))
    events = ScheduleEvent.objects.filter(schedule=schedule).order_by("-at", "-id")
    # The API's next run and next fires (docs/api.md), ten of them here: only an active
    # schedule fires, a paused one shows its state, not the instants its pause canceled
    # (docs/ui.md).
    upcoming = upcoming_runs([schedule], now=now, fires=DETAIL_FIRES)[schedule.id]
    # Why and since when a paused schedule is paused: its last `paused` event.
    paused_by = (
        events.filter(kind=ScheduleEvent.Kind.PAUSED).first()
        if schedule.state == Schedule.State.PAUSED else None
    )  # fmt: skip
    return render(request, "tick/schedule_detail.html", {
        "schedule": schedule,
        "versions": page_list(request, "versions", _version_changes(versions)),
        "events": page_list(request, "events", events),
        "next_run": upcoming.next_run_at,
        "preview": schedule_preview_instants(schedule=schedule, instants=upcoming.fires),
        "recent": _recent_occurrences(request, schedule, now),
        "recent_all": f"{reverse('occurrence-list')}?schedule={schedule.id}",
        "receipt": result.receipt if result else None,
        "dst_changes": schedule_dst_changes(timing=schedule, now=now),
        "words": schedule_in_words(schedule), "paused_by": paused_by,
        "nav": "schedules", **_manual_context(schedule, manual, now),
    }, status=status)  # fmt: skip


@tenant_page
def schedule_detail(request: HttpRequest, schedule_id: str) -> HttpResponse:
    schedule = access_schedule(tenant=tick_of(request).tenant, schedule_id=schedule_id)
    return _detail(request, schedule, manual=_run_receipt_shown(request, schedule))


def _form_page(
    request: HttpRequest, form: ScheduleForm, schedule: Schedule | None, status: int = 200
) -> HttpResponse:
    return render(request, "tick/schedule_form.html", {
        "form": form, "schedule": schedule, "zones": zone_names(), "nav": "schedules",
    }, status=status)  # fmt: skip


@tenant_page
def schedule_new(request: HttpRequest) -> HttpResponse:
    tick = tick_of(request)
    if request.method != "POST":
        initial = {"kind": "cron"}
        return _form_page(request, ScheduleForm(initial=initial), None)
    admin_only(request)
    form = ScheduleForm(request.POST)
    serializer = validated_create(form, tenant=tick.tenant)
    if serializer is None:
        return _form_page(request, form, None, status=400)
    try:
        schedule = schedule_create(
            tenant=tick.tenant, spec=serializer.to_spec(), actor=actor_of(request)
        )
    except LifecycleError as err:
        form.add_error(err.field if err.field in form.fields else None, err.message)
        return _form_page(request, form, None, status=err.status)
    messages.success(request, f"Schedule “{schedule.name}” created (version 1).")
    return redirect(reverse("schedule-detail", args=[schedule.id]))


@tenant_page
def schedule_edit(request: HttpRequest, schedule_id: str) -> HttpResponse:
    schedule = access_schedule(tenant=tick_of(request).tenant, schedule_id=schedule_id)
    if request.method != "POST":
        initial = schedule_as_input(schedule)
        initial["payload"] = json.dumps(initial["payload"], indent=2)
        initial["labels"] = labels_text(initial["labels"])
        return _form_page(request, ScheduleForm(initial=initial), schedule)
    admin_only(request)
    form = ScheduleForm(request.POST)
    serializer = validated_update(form, schedule)
    if serializer is None:
        return _form_page(request, form, schedule, status=400)
    try:
        result = schedule_update(
            schedule=schedule, spec=serializer.to_spec(), actor=actor_of(request)
        )
    except LifecycleError as err:
        form.add_error(err.field if err.field in form.fields else None, err.message)
        return _form_page(request, form, schedule, status=err.status)
    return _detail(request, result.schedule, result=result)


@tenant_page
@require_POST
def schedule_preview_draft(request: HttpRequest) -> HttpResponse:
    """The live preview (htmx, while typing): validated exactly as the API's draft preview;
    nothing is stored, so viewers may use it too. The DST changes of the coming year come
    first, whatever the ten fires reach."""
    form = ScheduleForm(request.POST)
    serializer = validated_draft(form, tenant=tick_of(request).tenant)
    if serializer is None:
        return render(request, "tick/_preview.html", {"form": form, "entries": None})
    now = timezone.now()
    spec = serializer.to_spec()
    words = None
    if spec.kind == Schedule.Kind.INTERVAL and spec.interval_s and spec.start_at:
        words = interval_rule_words(spec.interval_s, spec.start_at)
        words = words[:1].upper() + words[1:]
    return render(request, "tick/_preview.html", {
        "form": form, "entries": schedule_preview(timing=spec, after=now, count=10),
        "dst_changes": schedule_dst_changes(timing=spec, now=now), "words": words,
    })  # fmt: skip


@tenant_page
def schedule_describe(request: HttpRequest) -> HttpResponse:
    """The cron expression in words (htmx, under the field while typing); stores nothing."""
    expression = request.GET.get("expression", "")
    if not expression.strip():
        return render(request, "tick/_rule_words.html", {})
    try:
        words = cron_in_words(expression)
    except TimeRuleError as err:
        return render(request, "tick/_rule_words.html", {"error": err.message})
    return render(request, "tick/_rule_words.html", {"words": words})


def _lifecycle(request: HttpRequest, schedule_id: str, action: Any) -> HttpResponse:
    # The tenant door first: another tenant's id is a 404 even for a viewer, never a 403.
    schedule = access_schedule(tenant=tick_of(request).tenant, schedule_id=schedule_id)
    admin_only(request)
    try:
        result = action(schedule=schedule, actor=actor_of(request))
    except LifecycleError as err:
        messages.error(request, err.message)
        schedule.refresh_from_db()
        return _detail(request, schedule, status=err.status)
    return _detail(request, result.schedule, result=result)


@tenant_page
@require_POST
def schedule_pause_view(request: HttpRequest, schedule_id: str) -> HttpResponse:
    return _lifecycle(request, schedule_id, schedule_pause)


@tenant_page
@require_POST
def schedule_resume_view(request: HttpRequest, schedule_id: str) -> HttpResponse:
    return _lifecycle(request, schedule_id, schedule_resume)


@tenant_page
@require_POST
def schedule_cancel_view(request: HttpRequest, schedule_id: str) -> HttpResponse:
    return _lifecycle(request, schedule_id, schedule_cancel)


# --------------------------------------------------------------------------------------------
# Run now and backfill (apps/occurrences/manual_runs.py; the API's validation)
# --------------------------------------------------------------------------------------------

# The backfill dialog's fields: UTC, 24-hour, as the pages write instants (docs/ui.md).
_UTC_MINUTE = "%Y-%m-%d %H:%M"
# The dialog's default range: the longest of these that one backfill accepts.
_BACKFILL_SPANS = (timedelta(days=1), timedelta(hours=1), timedelta(minutes=10))


def _backfill_default_start(schedule: Schedule, end: datetime) -> datetime:
    """The start of the longest default span whose instants fit one backfill (the last 24 h
    of an every-minute rule hold 1,440, over the cap: the dialog would open on an error)."""
    for span in _BACKFILL_SPANS:
        try:
            backfill_instants(schedule=schedule, start=end - span, end=end)
        except BackfillTooLarge:
            continue
        return end - span
    return end - _BACKFILL_SPANS[-1]


def _manual_context(
    schedule: Schedule, manual: RunNowReceipt | BackfillReceipt | None, now: datetime
) -> dict[str, Any]:
    """The run-now form's fresh request id (a resubmitted form runs once) and the backfill
    dialog's default range (the last 24 h, or less when those hold too many instants)."""
    end = now.replace(second=0, microsecond=0)
    return {
        "run_receipt": manual if isinstance(manual, RunNowReceipt) else None,
        "backfill_receipt": manual if isinstance(manual, BackfillReceipt) else None,
        "run_request_id": str(uuid.uuid4()),
        "backfill_from": _backfill_default_start(schedule, end).strftime(_UTC_MINUTE),
        "backfill_to": end.strftime(_UTC_MINUTE),
        "backfill_max": settings.TICK_BACKFILL_MAX_INSTANTS,
    }


def _as_utc_text(text: str) -> str:
    """A form's `YYYY-MM-DD HH:MM` value (no offset) read as UTC; anything else as typed, for
    the serializer to judge."""
    value = parse_datetime(text.strip()) if text else None
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC).isoformat()
    return text


def _backfill_args(request: HttpRequest) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The dialog's fields validated like the API's body: (arguments, errors by field)."""
    data = {
        "from": _as_utc_text(request.POST.get("from", "")),
        "to": _as_utc_text(request.POST.get("to", "")),
        "only": request.POST.get("only", "missed"),
    }
    body = BackfillRequestSerializer(data=data)
    if not body.is_valid():
        return None, {name: [str(m) for m in msgs] for name, msgs in body.errors.items()}
    return dict(body.validated_data), {}


@tenant_page
@require_POST
def schedule_run_view(request: HttpRequest, schedule_id: str) -> HttpResponse:
    schedule = access_schedule(tenant=tick_of(request).tenant, schedule_id=schedule_id)
    admin_only(request)
    body = RunNowRequestSerializer(data={"request_id": request.POST.get("request_id", "")})
    request_id = body.validated_data["request_id"] if body.is_valid() else str(uuid.uuid4())
    try:
        receipt = schedule_run_now(
            schedule=schedule, actor=actor_of(request), request_id=request_id
        )
    except LifecycleError as err:
        messages.error(request, err.message)
        return _detail(request, schedule, status=err.status)
    # Post/redirect/get: the receipt is shown once on the schedule's own address, so the
    # address bar leaves /run/ and a reload asks nothing again (docs/ui.md).
    request.session[_RUN_RECEIPT] = {
        "schedule": str(schedule.id), "at": receipt.at.isoformat(), "version": receipt.version,
        "occurrence": str(receipt.occurrence), "scheduled_for": receipt.scheduled_for.isoformat(),
        "lane": str(receipt.lane), "state": str(receipt.state),
        "request_id": receipt.request_id, "replayed": receipt.replayed,
    }  # fmt: skip
    return redirect("schedule-detail", schedule_id=schedule.id)


_RUN_RECEIPT = "tick_run_receipt"


def _run_receipt_shown(request: HttpRequest, schedule: Schedule) -> RunNowReceipt | None:
    """The receipt `schedule_run_view` left for this schedule's page, once."""
    saved = request.session.get(_RUN_RECEIPT)
    if not isinstance(saved, dict) or saved.get("schedule") != str(schedule.id):
        return None
    del request.session[_RUN_RECEIPT]
    return RunNowReceipt(
        action=ScheduleEvent.Kind.RUN_NOW, at=datetime.fromisoformat(saved["at"]),
        version=int(saved["version"]), occurrence=uuid.UUID(saved["occurrence"]),
        scheduled_for=datetime.fromisoformat(saved["scheduled_for"]), lane=Lane(saved["lane"]),
        state=Occurrence.State(saved["state"]), request_id=saved["request_id"],
        replayed=bool(saved["replayed"]),
    )  # fmt: skip


def _backfill_request(
    request: HttpRequest, schedule_id: str
) -> tuple[Schedule, dict[str, Any] | None, dict[str, Any]]:
    """The schedule (the tenant door, then the admin role) and the dialog's fields."""
    schedule = access_schedule(tenant=tick_of(request).tenant, schedule_id=schedule_id)
    admin_only(request)
    args, errors = _backfill_args(request)
    return schedule, args, errors


def _backfill(
    request: HttpRequest, schedule: Schedule, args: dict[str, Any], *, dry_run: bool
) -> BackfillReceipt:
    return schedule_backfill(
        schedule=schedule, actor=actor_of(request), start=args["from"], end=args["to"],
        only=args["only"], dry_run=dry_run,
    )  # fmt: skip


@tenant_page
@require_POST
def schedule_backfill_preview_view(request: HttpRequest, schedule_id: str) -> HttpResponse:
    """The dialog's preview (htmx): the backfill's dry run, nothing written."""
    schedule, args, errors = _backfill_request(request, schedule_id)
    receipt = None
    if args is not None:
        try:
            receipt = _backfill(request, schedule, args, dry_run=True)
        except LifecycleError as err:
            errors = {err.field or "non_field_errors": [err.message]}
    return render(request, "tick/_backfill_preview.html", {
        "schedule": schedule, "preview": receipt, "errors": errors, "form": request.POST,
    })  # fmt: skip


@tenant_page
@require_POST
def schedule_backfill_view(request: HttpRequest, schedule_id: str) -> HttpResponse:
    schedule, args, errors = _backfill_request(request, schedule_id)
    try:
        if args is None:
            raise LifecycleError(" ".join(f"{k}: {' '.join(v)}" for k, v in errors.items()))
        receipt = _backfill(request, schedule, args, dry_run=False)
    except LifecycleError as err:
        messages.error(request, f"Backfill refused: {err.message}")
        return _detail(request, schedule, status=err.status)
    return _detail(request, schedule, manual=receipt)
