"""The one door every tenant web page goes through: `tenant_page` resolves the signed-in
user's current tenant from their memberships (never from a URL or form value alone) and
attaches it to the request, `tick_of` reads it back, and `admin_only` refuses changes to
viewers (403). The API's door is `apps/tenants/authentication.py` (`principal_of`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from apps.tenants import rls
from apps.tenants.models import Membership, Tenant

SESSION_TENANT = "tick_tenant_id"


@dataclass(frozen=True)
class TenantContext:
    """Who is looking at which tenant, with which role."""

    tenant: Tenant
    role: str
    memberships: list[Membership]

    @property
    def is_admin(self) -> bool:
        return self.role == Membership.Role.ADMIN


def memberships_of(user: Any) -> list[Membership]:
    return list(
        Membership.objects.filter(user=user).select_related("tenant").order_by("tenant__slug")
    )


def tenant_context(request: HttpRequest) -> TenantContext | None:
    """The current tenant of the signed-in user: the one chosen in the session if the user is
    still a member, else their first membership; None if they belong to no tenant."""
    memberships = memberships_of(request.user)
    if not memberships:
        return None
    chosen = request.session.get(SESSION_TENANT)
    current = next((m for m in memberships if str(m.tenant_id) == chosen), memberships[0])
    return TenantContext(tenant=current.tenant, role=current.role, memberships=memberships)


def actor_of(request: HttpRequest) -> str:
    return f"user:{request.user.get_username()}"


View = TypeVar("View", bound=Callable[..., HttpResponse])


def tenant_page(view: View) -> View:
    """Login required, and a current tenant attached as `request.tick` (templates read it)."""

    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        context = tenant_context(request)
        if context is None:
            return render(request, "tick/no_tenant.html", status=403)
        rls.tenant_enter(context.tenant.pk)
        request.tick = context  # type: ignore[attr-defined]
        return view(request, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def tick_of(request: HttpRequest) -> TenantContext:
    """The tenant and role `tenant_page` resolved for this request."""
    context = getattr(request, "tick", None)
    if not isinstance(context, TenantContext):
        raise TypeError("tick_of() is for views behind @tenant_page.")
    return context


def admin_only(request: HttpRequest) -> None:
    """Viewers see everything of their tenant and change nothing."""
    if not tick_of(request).is_admin:
        raise PermissionDenied("Viewers cannot change anything in this tenant.")
