from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from apps.core.admin_base import TickModelAdmin, staff_actor
from apps.schedules.labels import DEFAULT_LABEL_LIMIT, label_errors
from apps.schedules.models import Schedule, ScheduleEvent, ScheduleVersion
from apps.schedules.services import schedule_rename
from apps.schedules.timerules import interval_rule_words
from apps.tenants.readable import detail_text, instant_text


class ScheduleVersionInline(admin.TabularInline[ScheduleVersion, Schedule]):
    model = ScheduleVersion
    extra = 0
    can_delete = False
    readonly_fields = fields = ("version", "valid_from", "valid_to", "definition")

    # Versions and events are written by the services only: no "Add another" that adds
    # nothing (docs/ui.md "Django admin").
    def has_add_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        return False


class ScheduleEventInline(admin.TabularInline[ScheduleEvent, Schedule]):
    model = ScheduleEvent
    extra = 0
    can_delete = False

    readonly_fields = fields = ("at", "kind", "version", "actor", "details")

    def has_add_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        return False

    @admin.display(description="Detail")
    def details(self, obj: ScheduleEvent) -> str:
        return detail_text(obj.detail)


@admin.register(Schedule)
class ScheduleAdmin(TickModelAdmin[Schedule]):
    list_display = ["name", "tenant", "kind", "rule", "time_zone", "state", "version",
                    "next_run", "timeout", "shard", "occurrences_link"]  # fmt: skip
    list_filter = ["state", "kind", "precision", "misfire_policy", "handler"]
    search_fields = ["name", "=id", "tenant__slug"]
    list_select_related = ["tenant"]
    raw_id_fields = ["tenant"]
    show_full_result_count = False  # COUNT(*) over 20M rows per page view is not free
    # State changes go through services (versions, events, receipts), never a raw form save.
    # `next_run_at` is the materializer's cursor: shown as "Next run" only while the schedule
    # is active (a paused one has none), like the tenant pages.
    # Labels are the one editable field: they make no version, and a save goes through
    # `schedule_rename` (validated with the API's rules, logged with the staff actor).
    exclude = ["next_run_at"]
    readonly_fields = [
        f.name for f in Schedule._meta.fields if f.name not in ("next_run_at", "labels")
    ]
    readonly_fields.append("next_run")
    inlines = [ScheduleVersionInline, ScheduleEventInline]
    # Pause, resume and cancel recall occurrences: apps/occurrences/admin.py adds them.

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_delete_permission(self, request: object, obj: object = None) -> bool:
        return False  # cancel, never delete: history stays for audit

    @admin.display(description="Rule")
    def rule(self, obj: Schedule) -> str:
        """The cron expression, or a fixed rate's period and anchor in words."""
        if obj.kind == Schedule.Kind.INTERVAL and obj.interval_s and obj.start_at:
            return interval_rule_words(obj.interval_s, obj.start_at)
        return obj.expression or "—"

    @admin.display(description="Next run", ordering="next_run_at")
    def next_run(self, obj: Schedule) -> str:
        if obj.state != Schedule.State.ACTIVE:
            return f"none ({obj.get_state_display().lower()})"
        return instant_text(obj.next_run_at) or "—"

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        # Every field but the labels is read-only (changes go through the actions): one
        # "Save", for the labels.
        context = {**(extra_context or {}), "show_save_and_continue": False,
                   "show_save_and_add_another": False}  # fmt: skip
        return super().change_view(request, object_id, form_url, context)

    def get_form(
        self,
        request: HttpRequest,
        obj: Schedule | None = None,
        change: bool = False,
        **kwargs: Any,
    ) -> type[forms.ModelForm[Schedule]]:
        form = super().get_form(request, obj, change, **kwargs)
        limit = obj.tenant.max_labels_per_schedule if obj is not None else DEFAULT_LABEL_LIMIT

        class LabelsForm(form):  # type: ignore[valid-type, misc]
            def clean_labels(self) -> dict[str, str]:
                labels = self.cleaned_data.get("labels") or {}
                errors = label_errors(labels, limit=limit)
                if errors:
                    raise forms.ValidationError(
                        [f"{field}: {' '.join(m)}" for field, m in errors.items()]
                    )
                return dict(labels)

        return LabelsForm

    def save_model(
        self, request: HttpRequest, obj: Schedule, form: forms.ModelForm[Schedule], change: bool
    ) -> None:
        saved = Schedule.objects.get(pk=obj.pk)
        schedule_rename(
            schedule=saved, name=saved.name, labels=form.cleaned_data["labels"],
            actor=staff_actor(request), now=timezone.now(),
        )  # fmt: skip

    @admin.display(description="Timeout", ordering="timeout_s")
    def timeout(self, obj: Schedule) -> str:
        return f"{obj.timeout_s} s" if obj.timeout_s is not None else "handler default"

    @admin.display(description="Occurrences")
    def occurrences_link(self, obj: Schedule) -> str:
        url = reverse("admin-occurrences") + f"?schedule={obj.id}&hours=168"
        return format_html('<a href="{}">browse</a>', url)
