"""Tenant web pages: the tenant switcher, API keys, webhook signing, members and invitations,
the activity log, the signed-in person's account (password, sessions). The tenancy door of
every web page (`tenant_page`, `tick_of`, `admin_only`) is `apps/tenants/web.py`."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar
from urllib.parse import urlencode, urlsplit

from axes.helpers import get_client_username
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse, reverse_lazy
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from apps.core.no_store import shows_secret
from apps.tenants import rls
from apps.tenants.accounts import password_changed, user_sessions, user_sessions_revoke_others
from apps.tenants.docs_pages import webhooks_guide_html
from apps.tenants.errors import LastSigningSecret, RefusedRequest, RotationInProgress
from apps.tenants.forms import InviteForm, NewAccountForm, RoleForm
from apps.tenants.login_security import login_lockout_ends_at
from apps.tenants.members import (
    access_invitation,
    access_membership,
    invitation_accept,
    invitation_by_token,
    invitation_create,
    invitation_resend,
    invitation_revoke,
    invitations_for,
    members_for,
    membership_change_role,
    membership_remove,
    users_with_address,
)
from apps.tenants.models import ApiKey, Invitation, Membership, SigningSecret, Tenant, TenantEvent
from apps.tenants.page_lists import page_list
from apps.tenants.services import api_key_create, api_key_revoke_for_tenant
from apps.tenants.signing import (
    access_signing_secret,
    signing_secret_revoke,
    signing_secret_rotate,
    signing_secrets_of,
)
from apps.tenants.text import CONTROL_CHARACTERS_MESSAGE, has_control_characters
from apps.tenants.web import (
    SESSION_TENANT,
    actor_of,
    admin_only,
    memberships_of,
    tenant_context,
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
        elif has_control_characters(name):
            messages.error(request, CONTROL_CHARACTERS_MESSAGE)
        else:
            role = request.POST.get("role", Membership.Role.ADMIN)
            if role not in Membership.Role.values:
                role = Membership.Role.ADMIN
            try:
                key, created_raw = api_key_create(
                    tenant=tick.tenant, name=name, role=Membership.Role(role),
                    actor=actor_of(request), created_by=request.user,  # type: ignore[arg-type]
                )  # fmt: skip
            except RefusedRequest as err:
                messages.error(request, err.message)
            else:
                messages.success(
                    request, f"Key {key.prefix}… created. Copy it now: it is shown once."
                )
    keys = page_list(
        request,
        "keys",
        ApiKey.objects.filter(tenant=tick.tenant)
        .select_related("created_by")
        .order_by("-created_at"),
    )
    return render(
        request,
        "tick/api_keys.html",
        {"keys": keys, "created_raw": created_raw, "nav": "keys", "roles": Membership.Role.choices},
    )


@tenant_page
@require_POST
def api_key_revoke(request: HttpRequest, key_id: str) -> HttpResponse:
    admin_only(request)
    tick = tick_of(request)
    key = api_key_revoke_for_tenant(tenant=tick.tenant, key_id=key_id, actor=actor_of(request))
    if key is None:
        raise Http404("No such API key.")
    messages.success(request, f"Key {key.prefix}… revoked; requests with it now answer 401.")
    return redirect(reverse("api-keys"))


# --- team: members, invitations, activity (docs/ui.md) --------------------------------------


def _site_url(request: HttpRequest) -> str:
    return request.build_absolute_uri("/")


def _role(value: str) -> Membership.Role:
    return Membership.Role(value)


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
    rows = page_list(request, "secrets", (
        (secret, secret.status_at(now)) for secret in signing_secrets_of(tenant=tick.tenant)
    ))  # fmt: skip
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
    form = InviteForm()
    if request.method == "POST":
        admin_only(request)
        form = InviteForm(request.POST)
        if form.is_valid():
            email = form.cleaned_data["email"]
            try:
                invitation_create(
                    tenant=tick.tenant, email=email, role=_role(form.cleaned_data["role"]),
                    actor=actor_of(request), site_url=_site_url(request),
                )  # fmt: skip
            except RefusedRequest as refused:
                form.add_error("email", refused.message)
            else:
                messages.success(request, f"Invitation sent to {email}.")
                return redirect("members")
    now = timezone.now()
    invitations = page_list(request, "invitations", (
        (invitation, invitation.state_at(now))
        for invitation in invitations_for(tenant=tick.tenant).filter(accepted_at__isnull=True)
    ))  # fmt: skip
    return render(
        request,
        "tick/members.html",
        {
            "members": page_list(request, "members", members_for(tenant=tick.tenant)),
            "invitations": invitations,
            "form": form,
            "roles": Membership.Role.choices,
            "pending": Invitation.State.PENDING,
            "nav": "members",
            "self_id": request.user.pk,
            "ttl_days": settings.TICK_INVITATION_TTL_DAYS,
        },
    )


def _refusal_or(request: HttpRequest, action: Callable[[], str]) -> HttpResponse:
    try:
        messages.success(request, action())
    except RefusedRequest as refused:
        messages.error(request, refused.message)
    return redirect("members")


Row = TypeVar("Row")


def _change_on(
    door: Callable[[Tenant, str], Row],
) -> Callable[[Callable[[HttpRequest, Row], str]], Callable[..., HttpResponse]]:
    """A change of the members page to one row: POST only; the tenant door (another tenant's
    id is a 404) before the role (a viewer's 403); then `change(request, row)`, whose message,
    or its refusal's, the page shows."""

    def decorate(change: Callable[[HttpRequest, Row], str]) -> Callable[..., HttpResponse]:
        @tenant_page
        @require_POST
        @wraps(change)
        def view(request: HttpRequest, **ids: str) -> HttpResponse:
            (row_id,) = ids.values()
            row = door(tick_of(request).tenant, row_id)
            admin_only(request)
            return _refusal_or(request, lambda: change(request, row))

        return view

    return decorate


def _invitation(tenant: Tenant, invitation_id: str) -> Invitation:
    return access_invitation(tenant=tenant, invitation_id=invitation_id)


def _membership(tenant: Tenant, membership_id: str) -> Membership:
    return access_membership(tenant=tenant, membership_id=membership_id)


@_change_on(_invitation)
def invitation_resend_view(request: HttpRequest, invitation: Invitation) -> str:
    invitation_resend(invitation=invitation, actor=actor_of(request), site_url=_site_url(request))
    return f"Invitation to {invitation.email} sent again; the earlier link no longer works."


@_change_on(_invitation)
def invitation_revoke_view(request: HttpRequest, invitation: Invitation) -> str:
    invitation_revoke(invitation=invitation, actor=actor_of(request))
    return f"Invitation to {invitation.email} revoked."


@_change_on(_membership)
def member_role_view(request: HttpRequest, membership: Membership) -> str:
    form = RoleForm(request.POST)
    if not form.is_valid():
        raise RefusedRequest("Choose admin or viewer.")
    changed = membership_change_role(
        membership=membership, role=_role(form.cleaned_data["role"]), actor=actor_of(request)
    )
    return f"{changed.user.get_username()} is now {changed.get_role_display().lower()}."


@_change_on(_membership)
def member_remove_view(request: HttpRequest, membership: Membership) -> str:
    membership_remove(membership=membership, actor=actor_of(request))
    return f"{membership.user.get_username()} was removed from {tick_of(request).tenant.name}."


ACTIVITY_PAGE = 50


@tenant_page
def activity(request: HttpRequest) -> HttpResponse:
    """The tenant's account audit log, newest first; "older" pages by id (keyset)."""
    tick = tick_of(request)
    events = TenantEvent.objects.filter(tenant=tick.tenant).order_by("-at", "-id")
    before = request.GET.get("before", "")
    if before.isascii() and before.isdigit() and len(before) <= 18:  # a bigint, or ignored
        events = events.filter(id__lt=int(before))
    page = list(events[: ACTIVITY_PAGE + 1])
    older = page[ACTIVITY_PAGE - 1].id if len(page) > ACTIVITY_PAGE else None
    return render(
        request,
        "tick/activity.html",
        {"events": page[:ACTIVITY_PAGE], "older": older, "nav": "activity"},
    )


# --- accepting an invitation (signed in or not) -------------------------------------------


def invitation_accept_view(request: HttpRequest, token: str) -> HttpResponse:
    check = invitation_by_token(token)
    if check.invitation is None or check.refusal:
        status = 404 if check.invitation is None else 410
        return render(
            request, "tick/invitation_accept.html", {"refusal": check.refusal}, status=status
        )
    invitation = check.invitation
    user = request.user if request.user.is_authenticated else None
    existing = users_with_address(invitation.email).exists()
    form = NewAccountForm(email=invitation.email)
    error: str | None = None
    if request.method == "POST":
        if user is None and not existing:
            form = NewAccountForm(request.POST, email=invitation.email)
        if user is not None or (not existing and form.is_valid()):
            try:
                membership, joined = invitation_accept(
                    token=token, user=user,
                    password=form.cleaned_data["password1"] if user is None else None,
                )  # fmt: skip
            except RefusedRequest as refused:
                error = refused.message
            else:
                if user is None:
                    login(
                        request,
                        joined,  # type: ignore[arg-type]
                        backend="django.contrib.auth.backends.ModelBackend",
                    )
                request.session[SESSION_TENANT] = str(membership.tenant_id)
                messages.success(
                    request,
                    f"Welcome to {membership.tenant.name}: you are "
                    f"{membership.get_role_display().lower()}.",
                )
                return redirect("dashboard")
    mismatch = (
        user is not None and not users_with_address(invitation.email).filter(pk=user.pk).exists()
    )
    context = {
        "invitation": invitation,
        "form": form,
        "error": error,
        "existing": existing,
        "mismatch": mismatch,
        "login_url": f"{reverse('login')}?{urlencode({'next': request.path})}",
    }
    return render(request, "tick/invitation_accept.html", context)


@tenant_page
def webhooks_guide(request: HttpRequest) -> HttpResponse:
    """docs/webhooks.md for tenants: what is signed and how to verify it."""
    return render(request, "tick/doc_page.html", {
        "title": "Receiving Tick's webhooks", "html": webhooks_guide_html(), "nav": "signing",
    })  # fmt: skip


# --- the signed-in person's account: password, sessions -------------------------------------


def _with_current_tenant(request: HttpRequest) -> None:
    """The account pages belong to the person, not a tenant, so they open without one; when
    the person has one, it is attached like on every tenant page, so the header keeps the
    navigation and the tenant switcher (docs/ui.md "Team and account")."""
    context = tenant_context(request)
    if context is not None:
        rls.tenant_enter(context.tenant.pk)
        request.tick = context  # type: ignore[attr-defined]


@login_required
def account(request: HttpRequest) -> HttpResponse:
    _with_current_tenant(request)
    sessions = user_sessions(user=request.user, current_key=request.session.session_key)
    return render(request, "tick/account.html", {
        "sessions": page_list(request, "sessions", sessions), "session_count": len(sessions),
        "nav": "account",
    })  # fmt: skip


@login_required
@require_POST
def account_sessions_revoke(request: HttpRequest) -> HttpResponse:
    ended = user_sessions_revoke_others(user=request.user, current_key=request.session.session_key)
    messages.success(request, f"Signed out of {ended} other session(s); this one stays.")
    return redirect("account")


class Login(auth_views.LoginView):
    """Django's login page; a signed-in person is sent on to `next`, or to the dashboard when
    `next` is the login page itself (Django would raise "Redirection loop", a 500)."""

    redirect_authenticated_user = True

    def get_redirect_url(self) -> str:
        target = super().get_redirect_url()
        if target and urlsplit(target).path == reverse("login"):
            return ""
        return target


class PasswordChange(auth_views.PasswordChangeView):
    template_name = "tick/password_change.html"
    success_url = reverse_lazy("account")

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if request.user.is_authenticated:
            _with_current_tenant(request)
        return super().dispatch(request, *args, **kwargs)

    def form_valid(self, form: Any) -> HttpResponse:
        response = super().form_valid(form)
        password_changed(user=form.user, via="change", current_key=self.request.session.session_key)
        messages.success(self.request, "Password changed; your other sessions were signed out.")
        return response


class PasswordReset(auth_views.PasswordResetView):
    template_name = "tick/password_reset.html"
    email_template_name = "tick/email/password_reset.txt"
    subject_template_name = "tick/email/password_reset_subject.txt"
    success_url = reverse_lazy("password-reset-sent")


class PasswordResetConfirm(auth_views.PasswordResetConfirmView):
    template_name = "tick/password_reset_confirm.html"
    success_url = reverse_lazy("password-reset-complete")

    def form_valid(self, form: Any) -> HttpResponse:
        response = super().form_valid(form)
        password_changed(user=form.user, via="reset")
        return response
