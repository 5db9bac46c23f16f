"""The admin site: Django's, plus a TOTP second factor for staff when TICK_ADMIN_OTP_REQUIRED
(on unless DEBUG). A session counts as verified once django-otp's OTPMiddleware finds the
device it passed in the session; password-only sessions (e.g. from the tenant /login/) are
sent back to the admin login for a code. Docs: docs/operations.md "Admin two-factor"."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.admin import AdminSite
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.forms import CharField, TextInput
from django.http import HttpRequest
from django_otp import devices_for_user
from django_otp.admin import OTPAdminAuthenticationForm

from apps.tenants import rls


class TotpAdminAuthenticationForm(OTPAdminAuthenticationForm):
    """Username, password and the current code of the user's authenticator app."""

    otp_token = CharField(
        required=False,
        label="Authenticator code",
        widget=TextInput(attrs={"autocomplete": "one-time-code", "inputmode": "numeric"}),
    )
    otp_error_messages = {
        **OTPAdminAuthenticationForm.otp_error_messages,
        "token_required": "Enter the 6-digit code of your authenticator app.",
        "invalid_token": "That code is wrong or already used; enter the current one.",
    }

    def clean(self) -> dict[str, Any]:
        # The password first (AdminAuthenticationForm: authenticate, staff only), then the code.
        self.cleaned_data = AdminAuthenticationForm.clean(self)
        user = self.get_user()
        # The password is right: row-level security now shows this user's own devices.
        rls.user_enter(user.pk)
        devices = list(devices_for_user(user, confirmed=True))
        if not devices:
            raise ValidationError(
                "This staff account has no authenticator enrolled, and the admin requires "
                "one. Ask an operator to run `manage.py otp_enrol "
                f"{user.get_username()}`.",
                code="no_device",
            )
        # One device (what otp_enrol leaves) is chosen for the user: no extra round trip to
        # pick it. With several, the form lists them after the first try (django-otp).
        if not self.cleaned_data.get("otp_device") and len(devices) == 1:
            self.cleaned_data["otp_device"] = devices[0].persistent_id
        self.clean_otp(user)
        return self.cleaned_data


class TickAdminSite(AdminSite):
    """`admin.site` (tickweb.apps.TickAdminConfig). Every admin view, the occurrence browser's
    `admin.site.admin_view` pages included, asks has_permission()."""

    def has_permission(self, request: HttpRequest) -> bool:
        if not super().has_permission(request):
            return False
        if not settings.TICK_ADMIN_OTP_REQUIRED:
            return True
        return bool(request.user.is_verified())  # type: ignore[union-attr]

    # Properties, not per-request assignments: one site object serves every thread.
    @property
    def login_form(self) -> type[AuthenticationForm]:  # type: ignore[override]
        if settings.TICK_ADMIN_OTP_REQUIRED:
            return TotpAdminAuthenticationForm
        return AdminAuthenticationForm

    @property
    def login_template(self) -> str:  # type: ignore[override]
        if settings.TICK_ADMIN_OTP_REQUIRED:
            return "admin/login_totp.html"
        return "admin/login.html"
