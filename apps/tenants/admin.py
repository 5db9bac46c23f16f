from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from apps.core.admin_base import ReadOnlyTickModelAdmin, TickModelAdmin, staff_actor
from apps.tenants.members import member_keys_demote
from apps.tenants.models import (
    ApiKey,
    Invitation,
    Membership,
    SigningSecret,
    Tenant,
    TenantEvent,
)
from apps.tenants.readable import detail_text, instant_text
from apps.tenants.services import (
    api_key_expiry_check,
    api_key_expiry_shorten,
    api_keys_revoke,
    log_tenant_event,
    member_keys_revoke,
    tenant_settings_log,
)

RECENT_EVENTS = 20


@admin.register(Tenant)
class TenantAdmin(TickModelAdmin[Tenant]):
    list_display = ["slug", "name", "max_active_schedules", "trigger_rate_per_s", "max_running",
                    "max_timeout_s", "created_at"]  # fmt: skip
    search_fields = ["slug", "name"]
    # Quotas are editable here; usage is read-only, counted for the one tenant shown.
    readonly_fields = ["active_api_keys", "recent_events"]

    # Schedules, occurrences and events keep a tenant's rows (no database cascade, history
    # stays for audit): a delete always ended in "Cannot delete tenant", so none is offered.
    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    fieldsets = [
        (None, {"fields": ["slug", "name"]}),
        ("Quotas", {"fields": ["max_active_schedules", "trigger_rate_per_s", "max_running",
                               "catchup_rate_per_s", "min_interval_s", "api_rate_per_min",
                               "retry_budget_per_hour", "max_timeout_s",
                               "max_labels_per_schedule"]}),
        ("Schedule defaults", {"fields": ["pause_after_dead"]}),
        ("Webhooks", {"fields": ["webhook_allowed_ports"]}),
        # apps/occurrences/admin.py adds the schedule and occurrence counts (this app sees
        # neither).
        ("Usage", {"fields": ["active_api_keys"]}),
        ("Account log", {"fields": ["recent_events"]}),
    ]  # fmt: skip

    @admin.display(description="Active API keys")
    def active_api_keys(self, obj: Tenant) -> int:
        return obj.api_keys.filter(revoked_at__isnull=True).count() if obj.pk else 0

    @admin.display(description=f"Latest {RECENT_EVENTS} account events")
    def recent_events(self, obj: Tenant) -> SafeString | str:
        if not obj.pk:
            return "—"
        events = list(obj.events.order_by("-at", "-id")[:RECENT_EVENTS])
        link = reverse("admin:tenants_tenantevent_changelist") + f"?tenant__id__exact={obj.pk}"
        rows = format_html_join(
            "", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            ((instant_text(e.at), e.get_kind_display(), e.actor, detail_text(e.detail))
             for e in events),
        )  # fmt: skip
        return format_html(
            '<table class="tick-events"><thead><tr><th>At</th><th>What</th><th>Who</th>'
            '<th>Detail</th></tr></thead><tbody>{}</tbody></table><p><a href="{}">All events '
            "of this tenant »</a></p>",
            rows or mark_safe('<tr><td colspan="4">No event yet.</td></tr>'),  # noqa: S308
            link,
        )

    def save_model(self, request: HttpRequest, obj: Tenant, form: Any, change: bool) -> None:
        # The change form runs in one transaction: the row and its event commit together.
        before = form.initial
        super().save_model(request, obj, form, change)
        if change:
            changes = {f: (before.get(f), getattr(obj, f)) for f in form.changed_data}
            tenant_settings_log(tenant=obj, changes=changes, actor=staff_actor(request))


@admin.register(Membership)
class MembershipAdmin(TickModelAdmin[Membership]):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role"]
    search_fields = ["user__username", "tenant__slug"]
    list_select_related = ["user", "tenant"]
    raw_id_fields = ["user", "tenant"]

    # Granting, changing and removing access are support actions: each is in the tenant's
    # event log (the admin wraps each in one transaction with the change).
    def save_model(self, request: HttpRequest, obj: Membership, form: Any, change: bool) -> None:
        before = form.initial.get("role") if change else None
        super().save_model(request, obj, form, change)
        if not change or "role" in form.changed_data:
            log_tenant_event(
                tenant=obj.tenant, kind=TenantEvent.Kind.MEMBER_ROLE_CHANGED,
                actor=staff_actor(request), user=obj.user.get_username(),
                role=[before, obj.role],
            )  # fmt: skip
            member_keys_demote(membership=obj, actor=staff_actor(request))

    def delete_model(self, request: HttpRequest, obj: Membership) -> None:
        self._log_removed(request, [obj])
        super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Membership]) -> None:
        self._log_removed(request, list(queryset.select_related("user", "tenant")))
        super().delete_queryset(request, queryset)

    def _log_removed(self, request: HttpRequest, memberships: list[Membership]) -> None:
        for membership in memberships:
            member_keys_revoke(
                tenant_id=membership.tenant_id, user_id=membership.user_id,
                actor=staff_actor(request), reason="member_removed",
            )  # fmt: skip
            log_tenant_event(
                tenant=membership.tenant, kind=TenantEvent.Kind.MEMBER_REMOVED,
                actor=staff_actor(request), user=membership.user.get_username(),
                role=membership.role,
            )  # fmt: skip


class ApiKeyForm(forms.ModelForm[ApiKey]):
    class Meta:
        model = ApiKey
        fields = ["expires_at"]

    def clean_expires_at(self) -> Any:
        wanted = self.cleaned_data.get("expires_at")
        try:
            api_key_expiry_check(current=self.instance.expires_at, wanted=wanted)
        except ValidationError as err:
            raise forms.ValidationError(err.messages) from err
        return wanted


@admin.register(ApiKey)
class ApiKeyAdmin(TickModelAdmin[ApiKey]):
    # The hash is useless to a person and the raw key is never stored: neither is shown.
    form = ApiKeyForm
    list_display = ["prefix", "name", "tenant", "role", "created_by", "created_at",
                    "last_used_at", "expires_at", "revoked_at"]  # fmt: skip
    list_filter = ["tenant"]
    list_select_related = ["tenant", "created_by"]
    search_fields = ["prefix", "name", "tenant__slug"]
    fields = ["tenant", "name", "prefix", "role", "created_by", "created_at", "expires_at",
              "revoked_at", "last_used_at"]  # fmt: skip
    # Revocation is one-way and goes through the logged action; an expiry can only be
    # brought forward (ApiKeyForm). docs/security.md "Admin permissions".
    readonly_fields = ["tenant", "name", "prefix", "role", "created_by", "created_at",
                       "revoked_at", "last_used_at"]  # fmt: skip
    actions = ["revoke"]

    def has_add_permission(self, request: object) -> bool:
        return False  # keys are created by `manage.py tenant_create --api-key` or the API

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change and "expires_at" in form.changed_data and obj.expires_at is not None:
            api_key_expiry_shorten(key=obj, expires_at=obj.expires_at, actor=staff_actor(request))

    @admin.action(
        description="Revoke selected keys (requests with them answer 401)", permissions=["change"]
    )
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        revoked = api_keys_revoke(
            key_ids=list(queryset.values_list("pk", flat=True)[:500]), actor=staff_actor(request)
        )
        self.message_user(request, f"Revoked {len(revoked)} key(s).", messages.SUCCESS)


@admin.register(TenantEvent)
class TenantEventAdmin(ReadOnlyTickModelAdmin[TenantEvent]):
    """The account audit log, read-only: it is written only by the services that act."""

    list_display = ["at", "tenant", "kind", "actor", "details"]
    list_filter = ["kind", "tenant"]
    search_fields = ["=tenant__slug", "actor"]
    list_select_related = ["tenant"]
    ordering = ["-at", "-id"]
    show_full_result_count = False
    fields = ["at", "tenant", "kind", "actor", "details"]
    readonly_fields = ["at", "tenant", "kind", "actor", "details"]

    @admin.display(description="Detail")
    def details(self, obj: TenantEvent) -> str:
        return detail_text(obj.detail)


@admin.register(SigningSecret)
class SigningSecretAdmin(ReadOnlyTickModelAdmin[SigningSecret]):
    """Read-only for support staff: which secrets a tenant has and when they rotated. The
    encrypted secret is never shown; tenants rotate and revoke themselves (docs/webhooks.md)."""

    list_display = ["prefix", "tenant", "created_at", "expires_at", "revoked_at"]
    list_filter = ["tenant"]
    list_select_related = ["tenant"]
    search_fields = ["prefix", "tenant__slug"]
    fields = ["tenant", "prefix", "created_at", "expires_at", "revoked_at"]
    readonly_fields = ["tenant", "prefix", "created_at", "expires_at", "revoked_at"]


@admin.register(Invitation)
class InvitationAdmin(ReadOnlyTickModelAdmin[Invitation]):
    """Read-only for support: tenants' admins invite, re-send and revoke in their own UI
    (apps/tenants/members.py, audited there). The token hash is never shown."""

    list_display = ["email", "tenant", "role", "invited_by", "sent_at", "expires_at",
                    "accepted_at", "revoked_at"]  # fmt: skip
    list_filter = ["role"]
    list_select_related = ["tenant"]
    search_fields = ["email", "tenant__slug"]
    fields = ("tenant", "email", "role", "invited_by", "created_at", "sent_at", "expires_at",
              "accepted_at", "accepted_by", "revoked_at")  # fmt: skip
    readonly_fields = fields
