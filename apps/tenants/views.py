"""Tenant web pages: the tenant switcher, API keys, members. Also the one door every tenant
page goes through: `tenant_page` resolves the signed-in user's current tenant from their
memberships (never from a URL or form value alone), and `admin_only` refuses changes to
viewers (403)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from apps.tenants.models import ApiKey, Membership, Tenant
from apps.tenants.services import api_key_create, api_key_revoke_for_tenant

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


class TenantRequest(HttpRequest):
    tick: TenantContext


View = TypeVar("View", bound=Callable[..., HttpResponse])


def tenant_page(view: View) -> View:
    """Login required, and a current tenant attached as `request.tick`."""

    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        context = tenant_context(request)
        if context is None:
            return render(request, "tick/no_tenant.html", status=403)
        request.tick = context  # type: ignore[attr-defined]
        return view(request, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def admin_only(request: HttpRequest) -> None:
    """Viewers see everything of their tenant and change nothing."""
    if not request.tick.is_admin:  # type: ignore[attr-defined]
        raise PermissionDenied("Viewers cannot change anything in this tenant.")


def _back(request: HttpRequest, default: str) -> HttpResponseRedirect:
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return HttpResponseRedirect(target)
    return redirect(default)


@login_required
@require_POST
def tenant_switch(request: HttpRequest) -> HttpResponse:
    """Switch the current tenant; only tenants the user is a member of (else 404)."""
    wanted = request.POST.get("tenant", "")
    if not any(str(m.tenant_id) == wanted for m in memberships_of(request.user)):
        raise Http404("No such tenant.")
    request.session[SESSION_TENANT] = wanted
    return _back(request, "dashboard")


@tenant_page
def api_keys(request: HttpRequest) -> HttpResponse:
    tick: TenantContext = request.tick  # type: ignore[attr-defined]
    created_raw: str | None = None
    if request.method == "POST":
        admin_only(request)
        name = request.POST.get("name", "").strip()
        if not name or len(name) > 100:
            messages.error(request, "Give the key a name of 1 to 100 characters.")
        else:
            key, created_raw = api_key_create(tenant=tick.tenant, name=name)
            messages.success(request, f"Key {key.prefix}… created. Copy it now: it is shown once.")
    keys = ApiKey.objects.filter(tenant=tick.tenant).order_by("-created_at")[:200]
    return render(
        request, "tick/api_keys.html", {"keys": keys, "created_raw": created_raw, "nav": "keys"}
    )


@tenant_page
@require_POST
def api_key_revoke(request: HttpRequest, key_id: str) -> HttpResponse:
    admin_only(request)
    tick: TenantContext = request.tick  # type: ignore[attr-defined]
    key = api_key_revoke_for_tenant(tenant=tick.tenant, key_id=key_id)
    if key is None:
        raise Http404("No such API key.")
    messages.success(request, f"Key {key.prefix}… revoked; requests with it now answer 401.")
    return redirect(reverse("api-keys"))


@tenant_page
def members(request: HttpRequest) -> HttpResponse:
    tick: TenantContext = request.tick  # type: ignore[attr-defined]
    rows = (
        Membership.objects.filter(tenant=tick.tenant)
        .select_related("user")
        .order_by("user__username")
    )
    return render(request, "tick/members.html", {"members": rows, "nav": "members"})
