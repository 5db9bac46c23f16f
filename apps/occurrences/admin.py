import json
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.utils import timezone

from apps.core.admin_base import TickModelAdmin, staff_actor
from apps.occurrences.execution.replay import occurrences_replay
from apps.occurrences.models import (
    Attempt,
    DispatchOutbox,
    Occurrence,
    ShardLease,
    WorkerPresence,
)
from apps.occurrences.schedule_changes import schedule_cancel, schedule_pause, schedule_resume
from apps.occurrences.selectors import parse_instant
from apps.schedules.admin import ScheduleAdmin
from apps.schedules.errors import LifecycleError
from apps.schedules.models import Schedule
from apps.schedules.services import QUOTA_STATES
from apps.tenants.admin import TenantAdmin
from apps.tenants.models import Tenant, TenantEvent
from apps.tenants.services import log_tenant_event

# Occurrence and Attempt have composite primary keys (id, scheduled_for), which Django 5.2's
# admin refuses to register: support staff use the occurrence browser views at the end of
# this file (/admin/occurrences/browse/).


@admin.register(DispatchOutbox)
class DispatchOutboxAdmin(TickModelAdmin[DispatchOutbox]):
    list_display = ["occurrence_id", "lane", "shard", "available_at", "created_at"]
    list_filter = ["lane"]
    readonly_fields = [f.name for f in DispatchOutbox._meta.fields]

    def has_add_permission(self, request: object) -> bool:
        return False


@admin.register(ShardLease)
class ShardLeaseAdmin(TickModelAdmin[ShardLease]):
    list_display = ["role", "shard", "owner", "generation", "lease_expires_at"]
    list_filter = ["role", "owner"]
    readonly_fields = ["role", "shard", "owner", "generation", "lease_expires_at"]


@admin.register(WorkerPresence)
class WorkerPresenceAdmin(TickModelAdmin[WorkerPresence]):
    """Workers and their slots as they last announced them (execution/presence.py); a row
    older than TICK_WORKER_PRESENCE_TTL_S no longer counts toward tenants' shares."""

    list_display = ["hostname", "slots", "seen_at"]
    ordering = ["-seen_at"]
    readonly_fields = ["hostname", "slots", "seen_at"]

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False


# --------------------------------------------------------------------------------------------
# Support staff's occurrence browser (docs/ui.md "Django admin"). Occurrence and Attempt have
# composite primary keys, so there is no ModelAdmin: these admin-site views list occurrences
# across tenants (filters by tenant, state, schedule and a bounded time range; keyset pages;
# the planner's row estimate instead of COUNT(*)), show one with its attempts, and replay DEAD
# ones through the same service as the API (`occurrences_replay`).
# --------------------------------------------------------------------------------------------


BROWSER_PAGE = 100


def estimated_rows(queryset: QuerySet[Occurrence]) -> int | None:
    """The planner's row estimate for the filtered query: free, unlike COUNT(*) over
    hundreds of millions of partitioned rows."""
    try:
        plan = json.loads(queryset.explain(format="json"))
        return int(plan[0]["Plan"]["Plan Rows"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def _staff_only(request: HttpRequest) -> None:
    if not request.user.has_perm("occurrences.view_dispatchoutbox"):
        raise PermissionDenied


def occurrence_browser(request: HttpRequest) -> HttpResponse:
    _staff_only(request)
    now = timezone.now()
    params = request.GET
    hours = params.get("hours", "24")
    valid = hours.isascii() and hours.isdigit() and len(hours) <= 4 and 0 < int(hours) <= 24 * 31
    span = timedelta(hours=int(hours)) if valid else None
    span = span or timedelta(hours=24)
    until, since = now + timedelta(hours=1), now + timedelta(hours=1) - span
    if params.get("until"):
        try:
            # Naive input is UTC wall-clock time, like the tenants' web filters.
            typed = parse_instant(params["until"], naive_as_utc=True)
            until, since = typed, typed - span
        except ValueError as err:
            messages.error(request, f"until: {err} Showing the default range.")
        except OverflowError:
            messages.error(request, "until: too close to the edge of the calendar.")
    queryset = Occurrence.objects.filter(scheduled_for__gte=since, scheduled_for__lt=until)
    tenants = list(Tenant.objects.order_by("slug").values_list("id", "slug"))
    if params.get("tenant"):
        queryset = queryset.filter(tenant__slug=params["tenant"])
    if params.get("state") in Occurrence.State.values:
        queryset = queryset.filter(state=params["state"])
    if params.get("schedule"):
        try:
            queryset = queryset.filter(schedule_id=uuid.UUID(params["schedule"]))
        except ValueError:
            messages.error(request, "Schedule must be a UUID.")
    if params.get("before"):
        try:
            before = parse_instant(params["before"], naive_as_utc=True)
            queryset = queryset.filter(scheduled_for__lt=before)
        except ValueError as err:
            messages.error(request, f"before: {err} Showing the first page.")
    rows = list(queryset.select_related("tenant", "schedule").order_by("-scheduled_for")[
        : BROWSER_PAGE + 1
    ])  # fmt: skip
    more = len(rows) > BROWSER_PAGE
    rows = rows[:BROWSER_PAGE]
    query = params.copy()
    query.pop("before", None)
    can_replay = request.user.has_perm("occurrences.change_dispatchoutbox")
    # A first page that holds every row knows the count exactly; the planner's estimate is
    # only for a range larger than a page (it said "about 2" above 40 rows).
    exact = len(rows) if not more and not params.get("before") else None
    context = {
        **admin.site.each_context(request),
        "title": "Occurrences" if can_replay else "Occurrences (read-only)", "rows": rows,
        "exact": exact, "estimate": estimated_rows(queryset) if exact is None else None,
        "since": since, "until": until, "tenants": tenants, "states": Occurrence.State.choices,
        "params": params, "filters": query.urlencode(),
        "next_before": rows[-1].scheduled_for.isoformat() if more and rows else None,
        "can_replay": can_replay,
    }  # fmt: skip
    return render(request, "admin/tick/occurrence_browser.html", context)


def occurrence_admin_detail(request: HttpRequest, occurrence_id: str) -> HttpResponse:
    _staff_only(request)
    try:
        occurrence = (
            Occurrence.objects.select_related("tenant", "schedule").filter(id=occurrence_id).first()
        )
    except ValidationError:
        occurrence = None
    if occurrence is None:
        raise Http404("No such occurrence.")
    attempts = Attempt.objects.filter(
        occurrence_id=occurrence.id, scheduled_for=occurrence.scheduled_for
    ).order_by("attempt_no")
    context = {
        **admin.site.each_context(request),
        "title": f"Occurrence {occurrence.id}", "occ": occurrence, "attempts": attempts,
        "can_replay": request.user.has_perm("occurrences.change_dispatchoutbox"),
    }  # fmt: skip
    return render(request, "admin/tick/occurrence_detail.html", context)


def occurrence_admin_replay(request: HttpRequest) -> HttpResponse:
    """Replay DEAD occurrences (POST ids), grouped by tenant, through `occurrences_replay`."""
    if request.method != "POST":
        return redirect(reverse("admin-occurrences"))
    if not request.user.has_perm("occurrences.change_dispatchoutbox"):
        raise PermissionDenied
    ids = []
    for value in request.POST.getlist("ids")[:500]:
        try:
            ids.append(uuid.UUID(value))
        except ValueError:
            continue
    by_tenant: dict[uuid.UUID, list[uuid.UUID]] = {}
    for occ_id, tenant_id in Occurrence.objects.filter(id__in=ids).values_list("id", "tenant_id"):
        by_tenant.setdefault(tenant_id, []).append(occ_id)
    replayed, not_dead = 0, 0
    actor = staff_actor(request)
    for tenant_id, tenant_ids in by_tenant.items():
        with transaction.atomic():  # the replay and its record in the tenant's event log
            result = occurrences_replay(tenant_id=tenant_id, occurrence_ids=tenant_ids)
            if result.replayed:
                log_tenant_event(
                    tenant=Tenant.objects.get(id=tenant_id),
                    kind=TenantEvent.Kind.OCCURRENCES_REPLAYED,
                    actor=actor,
                    occurrences=[str(i) for i in result.replayed],
                )
        replayed += len(result.replayed)
        not_dead += len(result.not_dead)
    messages.success(request, f"Replayed {replayed}; {not_dead} were not DEAD and were left alone.")
    return redirect(reverse("admin-occurrences"))


admin_urlpatterns = [
    path("occurrences/browse/", admin.site.admin_view(occurrence_browser),
         name="admin-occurrences"),
    path("occurrences/browse/replay/", admin.site.admin_view(occurrence_admin_replay),
         name="admin-occurrences-replay"),
    path("occurrences/browse/<str:occurrence_id>/", admin.site.admin_view(occurrence_admin_detail),
         name="admin-occurrence-detail"),
]  # fmt: skip


# The admin pages of the lower apps, with what needs this app: a tenant's usage counts and
# the schedule actions that recall occurrences (docs/architecture.md "The house").
admin.site.unregister(Tenant)
admin.site.unregister(Schedule)


@admin.register(Tenant)
class TenantUsageAdmin(TenantAdmin):
    readonly_fields = ["schedules_in_quota", "running_now", *TenantAdmin.readonly_fields]
    fieldsets = [
        (name, {"fields": ["schedules_in_quota", "running_now", *opts["fields"]]})
        if name == "Usage"
        else (name, opts)
        for name, opts in TenantAdmin.fieldsets
    ]

    @admin.display(description="Active + paused schedules")
    def schedules_in_quota(self, obj: Tenant) -> str:
        used = obj.schedules.filter(state__in=QUOTA_STATES).count() if obj.pk else 0
        return f"{used} / {obj.max_active_schedules}"

    @admin.display(description="Running occurrences (last 2 days)")
    def running_now(self, obj: Tenant) -> str:
        if not obj.pk:
            return "—"
        used = Occurrence.objects.filter(
            tenant=obj, state=Occurrence.State.RUNNING,
            scheduled_for__gte=timezone.now() - timedelta(days=2),
        ).count()  # fmt: skip
        return f"{used} / {obj.max_running}"


@admin.register(Schedule)
class ScheduleLifecycleAdmin(ScheduleAdmin):
    actions = ["pause", "resume", "cancel"]

    def _apply(self, request: HttpRequest, queryset: QuerySet[Schedule], action: str) -> None:
        # Through the lifecycle services: each change is in the schedule's event log with
        # the staff user as actor (docs/security.md "Event log").
        services: dict[str, Callable[..., Any]] = {
            "pause": schedule_pause, "resume": schedule_resume, "cancel": schedule_cancel,
        }  # fmt: skip
        service = services[action]
        past = {"pause": "Paused", "resume": "Resumed", "cancel": "Canceled"}[action]
        actor = staff_actor(request)
        done, refused = 0, []
        for schedule in queryset[:500]:
            try:
                service(schedule=schedule, actor=actor)
                done += 1
            except LifecycleError as err:
                refused.append(f"{schedule.name}: {err.message}")
        self.message_user(request, f"{past} {done} schedule(s).", messages.SUCCESS)
        for line in refused:
            self.message_user(request, line, messages.WARNING)

    @admin.action(
        description="Pause selected schedules (through the lifecycle service)",
        permissions=["change"],
    )
    def pause(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._apply(request, queryset, "pause")

    @admin.action(
        description="Resume selected schedules (through the lifecycle service)",
        permissions=["change"],
    )
    def resume(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._apply(request, queryset, "resume")

    @admin.action(
        description="Cancel selected schedules for good (kept for audit, never fire again)",
        permissions=["change"],
    )
    def cancel(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._apply(request, queryset, "cancel")
