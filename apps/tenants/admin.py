from datetime import timedelta

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from apps.occurrences.models import Occurrence
from apps.schedules.services import QUOTA_STATES
from apps.tenants.models import ApiKey, Membership, Tenant


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin[Tenant]):
    list_display = ["slug", "name", "max_active_schedules", "trigger_rate_per_s", "max_running",
                    "max_timeout_s", "created_at"]  # fmt: skip
    search_fields = ["slug", "name"]
    # Quotas are editable here; usage is read-only, counted for the one tenant shown.
    readonly_fields = ["schedules_in_quota", "running_now", "active_api_keys"]
    fieldsets = [
        (None, {"fields": ["slug", "name"]}),
        ("Quotas", {"fields": ["max_active_schedules", "trigger_rate_per_s", "max_running",
                               "catchup_rate_per_s", "min_interval_s", "api_rate_per_min",
                               "retry_budget_per_hour", "max_timeout_s"]}),
        ("Usage", {"fields": ["schedules_in_quota", "running_now", "active_api_keys"]}),
    ]  # fmt: skip

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

    @admin.display(description="Active API keys")
    def active_api_keys(self, obj: Tenant) -> int:
        return obj.api_keys.filter(revoked_at__isnull=True).count() if obj.pk else 0


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin[Membership]):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role"]
    search_fields = ["user__username", "tenant__slug"]
    list_select_related = ["user", "tenant"]
    raw_id_fields = ["user", "tenant"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin[ApiKey]):
    # The hash is useless to a person and the raw key is never stored: neither is shown.
    list_display = ["prefix", "name", "tenant", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["tenant"]
    list_select_related = ["tenant"]
    search_fields = ["prefix", "name", "tenant__slug"]
    fields = ["tenant", "name", "prefix", "created_at", "expires_at", "revoked_at", "last_used_at"]
    readonly_fields = ["tenant", "name", "prefix", "created_at", "last_used_at"]
    actions = ["revoke"]

    def has_add_permission(self, request: object) -> bool:
        return False  # keys are created by `manage.py tenant_create --api-key` or the API

    @admin.action(description="Revoke selected keys (requests with them answer 401)")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"Revoked {count} key(s).", messages.SUCCESS)
