"""Every web request runs under row-level security (apps/tenants/rls.py): the web role and the
signed-in user (`TenantRLSMiddleware`), a signed staff claim on the Django admin's pages once
the second factor passed (`StaffRLSMiddleware`); the tenant is added by the doors once they
know it (`apps/tenants/authentication.py`, `apps/tenants/web.py`)."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse
from django.urls import reverse

from apps.tenants import rls


def is_staff_admin_request(request: HttpRequest) -> bool:
    """Staff see every tenant in the Django admin (and its occurrence browser) only, and only
    once the session passed the second factor when the admin requires one: a staff user on
    the tenant pages, or with a password alone, is scoped like anyone else."""
    user = request.user
    if not (user.is_authenticated and user.is_active and user.is_staff):
        return False
    if settings.TICK_ADMIN_OTP_REQUIRED and not user.is_verified():  # type: ignore[union-attr,attr-defined]
        return False
    return request.path.startswith(reverse("admin:index"))


class TenantRLSMiddleware:
    """Placed after AuthenticationMiddleware (it reads `request.user`)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        user = request.user
        user_id = user.pk if user.is_authenticated else None
        rls.request_begin(user_id=user_id)
        try:
            return self.get_response(request)
        finally:
            try:
                rls.request_end()
            except DatabaseError:
                # The reset could not run (a broken connection or transaction): drop the
                # connection rather than hand its settings to the next request.
                connection.close()


class StaffRLSMiddleware:
    """Placed after django-otp's OTPMiddleware (it reads `request.user.is_verified()`)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        user_id = request.user.pk
        if user_id is not None and is_staff_admin_request(request):
            rls.staff_enter(int(user_id))
        return self.get_response(request)
