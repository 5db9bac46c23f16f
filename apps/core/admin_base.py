"""The admin's base class for support staff's actions (docs/security.md "Admin permissions").

Every action declares the permission it needs (`@admin.action(permissions=["change"])`), so
Django offers it only to staff who hold it. Django's own answer to an action POSTed by
someone who may not run it is a redirect with "No action selected."; here it is a 403, so a
forged or stale form is refused plainly and nothing runs.
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Model
from django.http import HttpRequest, HttpResponse

M = TypeVar("M", bound=Model)


def staff_actor(request: HttpRequest) -> str:
    """The event logs' actor for a support action: `support:<username>`."""
    return f"support:{request.user.get_username()}"


class TickModelAdmin(admin.ModelAdmin[M]):
    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if request.method == "POST" and "action" in request.POST:
            name = request.POST["action"]
            known = {site_name for site_name, _func in self.admin_site.actions}
            for action in self.actions or []:
                found = self.get_action(action)
                if found is not None:
                    known.add(found[1])
            if name in known and name not in self.get_actions(request):
                raise PermissionDenied(f"You may not run {name!r} here.")
        return super().changelist_view(request, extra_context)


class ReadOnlyTickModelAdmin(TickModelAdmin[M]):
    """Records support staff may look at but never add, change or delete (audit logs, secrets
    and invitations the tenants manage themselves)."""

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: object, obj: object = None) -> bool:
        return False
