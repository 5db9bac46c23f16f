"""Tenant web pages: the tenant switcher, API keys, webhook signing, members. The tenancy
door of every web page (`tenant_page`, `tick_of`, `admin_only`) is `apps/tenants/web.py`."""

from __future__ import annotations

import math
from typing import Any

from axes.helpers import get_client_username
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from apps.tenants.errors import LastSigningSecret, RotationInProgress
from apps.tenants.login_security import login_lockout_ends_at
from apps.tenants.models import ApiKey, Membership, SigningSecret
from apps.tenants.no_store import shows_secret
from apps.tenants.services import api_key_create, api_key_revoke_for_tenant
from apps.tenants.signing import (
    access_signing_secret,
    signing_secret_revoke,
    signing_secret_rotate,
    signing_secrets_of,
)
from apps.tenants.web import (
    SESSION_TENANT,
    actor_of,
    admin_only,
    memberships_of,
    tenant_page,
    tick_of,
)


def _back(request: HttpRequest, default: str) -> HttpResponseRedirect:
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return HttpResponseRedirect(target)
    return redirect(default)


def login_locked_out(
    request: HttpRequest,
    original_response: HttpResponse | None = None,
    credentials: dict[str, Any] | None = None,
) -> HttpResponse:
    """django-axes' lockout response (AXES_LOCKOUT_CALLABLE) for /login/ and /admin/login/:
    429 with the time the lock lifts, in the page and in Retry-After."""
    now = timezone.now()
    username = get_client_username(request, credentials) or ""
    # The failure that reached the limit is recorded before this runs, so the lock has an end;
    # the cool-off is the bound should the rows be gone (an operator's reset in between).
    ends_at = login_lockout_ends_at(username=username, now=now) or (
        now + settings.AXES_COOLOFF_TIME
    )
    wait_s = max(1, math.ceil((ends_at - now).total_seconds()))
    response = render(
        request,
        "registration/locked_out.html",
        {
            "username": username,
            "ends_at": ends_at,
            "wait_minutes": math.ceil(wait_s / 60),
            "failure_limit": settings.TICK_LOGIN_FAILURE_LIMIT,
            "login_url": request.path,
        },
        status=429,
    )
    response["Retry-After"] = str(wait_s)
    return response


@login_required
@require_POST
def tenant_switch(request: HttpRequest) -> HttpResponse:
    """Switch the current tenant; only tenants the user is a member of (else 404)."""
    wanted = request.POST.get("tenant", "")
    if not any(str(m.tenant_id) == wanted for m in memberships_of(request.user)):
        raise Http404("No such tenant.")
    request.session[SESSION_TENANT] = wanted
    return _back(request, "dashboard")


@shows_secret  # a new key's raw value is on this page once
@tenant_page
def api_keys(request: HttpRequest) -> HttpResponse:
    tick = tick_of(request)
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
    tick = tick_of(request)
    key = api_key_revoke_for_tenant(tenant=tick.tenant, key_id=key_id)
    if key is None:
        raise Http404("No such API key.")
    messages.success(request, f"Key {key.prefix}… revoked; requests with it now answer 401.")
    return redirect(reverse("api-keys"))


@tenant_page
@shows_secret  # a new secret is on this page once
def signing_secrets(request: HttpRequest) -> HttpResponse:
    """The tenant's webhook signing secrets; POST rotates (admins) and shows the new secret
    once, in a response no cache may keep (docs/webhooks.md)."""
    tick = tick_of(request)
    created_raw: str | None = None
    if request.method == "POST":
        admin_only(request)
        try:
            row, created_raw = signing_secret_rotate(tenant=tick.tenant, actor=actor_of(request))
        except RotationInProgress as refusal:
            messages.error(request, refusal.message)
        else:
            messages.success(
                request, f"Secret {row.prefix}… created. Copy it now: it is shown once."
            )
    now = timezone.now()
    rows = [(secret, secret.status_at(now)) for secret in signing_secrets_of(tenant=tick.tenant)]
    response = render(
        request,
        "tick/signing.html",
        {
            "rows": rows,
            "active": SigningSecret.Status.ACTIVE,
            "created_raw": created_raw,
            "overlap_h": round(settings.TICK_SIGNING_ROTATION_OVERLAP_S / 3600, 1),
            "nav": "signing",
        },
    )
    return response


@tenant_page
@require_POST
def signing_secret_revoke_view(request: HttpRequest, secret_id: str) -> HttpResponse:
    tick = tick_of(request)
    access_signing_secret(tenant=tick.tenant, secret_id=secret_id)  # 404 before the role
    admin_only(request)
    try:
        secret = signing_secret_revoke(
            tenant=tick.tenant, secret_id=secret_id, actor=actor_of(request)
        )
    except LastSigningSecret as refusal:
        messages.error(request, refusal.message)
    else:
        messages.success(request, f"Secret {secret.prefix}… revoked; webhooks no longer carry "
                                  "its signature.")  # fmt: skip
    return redirect(reverse("signing-secrets"))


@tenant_page
def members(request: HttpRequest) -> HttpResponse:
    tick = tick_of(request)
    rows = (
        Membership.objects.filter(tenant=tick.tenant)
        .select_related("user")
        .order_by("user__username")
    )
    return render(request, "tick/members.html", {"members": rows, "nav": "members"})
