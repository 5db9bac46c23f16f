from django.contrib import admin

from apps.tenants.models import ApiKey, Membership, Tenant


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin[Tenant]):
    list_display = ["slug", "name", "max_active_schedules", "trigger_rate_per_s", "created_at"]
    search_fields = ["slug", "name"]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin[Membership]):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role"]
    search_fields = ["user__username", "tenant__slug"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin[ApiKey]):
    # The hash is useless to a person and the raw key is never stored: neither is shown.
    list_display = ["prefix", "name", "tenant", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["tenant"]
    fields = ["tenant", "name", "prefix", "created_at", "expires_at", "revoked_at", "last_used_at"]
    readonly_fields = ["tenant", "name", "prefix", "created_at", "last_used_at"]

    def has_add_permission(self, request: object) -> bool:
        return False  # keys are created by `manage.py tenant_create --api-key` or the API
