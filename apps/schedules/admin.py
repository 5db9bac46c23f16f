from django.contrib import admin

from apps.schedules.models import Schedule, ScheduleEvent, ScheduleVersion


class ScheduleVersionInline(admin.TabularInline[ScheduleVersion, Schedule]):
    model = ScheduleVersion
    extra = 0
    can_delete = False
    readonly_fields = fields = ("version", "valid_from", "valid_to", "definition")


class ScheduleEventInline(admin.TabularInline[ScheduleEvent, Schedule]):
    model = ScheduleEvent
    extra = 0
    can_delete = False
    readonly_fields = fields = ("at", "kind", "version", "actor", "detail")


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin[Schedule]):
    list_display = ["name", "tenant", "kind", "expression", "time_zone", "state", "version",
                    "next_run_at", "shard"]  # fmt: skip
    list_filter = ["state", "kind", "precision"]
    search_fields = ["name", "id", "tenant__slug"]
    list_select_related = ["tenant"]
    show_full_result_count = False  # COUNT(*) over 20M rows per page view is not free
    # State changes go through services (versions, events, receipts), never a raw form save.
    readonly_fields = [f.name for f in Schedule._meta.fields]
    inlines = [ScheduleVersionInline, ScheduleEventInline]

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_delete_permission(self, request: object, obj: object = None) -> bool:
        return False  # cancel, never delete: history stays for audit
