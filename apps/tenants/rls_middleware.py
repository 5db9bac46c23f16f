"""Every web request runs under row-level security (apps/tenants/rls.py): the web role, the
signed-in user, and the staff flag on the Django admin's pages; the tenant is added by the
doors once they know it (`apps/tenants/authentication.py`, `apps/tenants/web.py`)."""

from __future__ import annotations

from collections.abc import Callable

from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse
from django.urls import reverse

from apps.tenants import rls


def _is_staff_admin_request(request: HttpRequest) -> bool:
    """Staff see every tenant in the Django admin (and its occurrence browser) only: a staff
    user on the tenant pages is scoped to their membership like anyone else."""
    user = request.user
    if not (user.is_authenticated and user.is_active and user.is_staff):
        return False
    return request.path.startswith(reverse("admin:index"))


class TenantRLSMiddleware:
    """Placed after AuthenticationMiddleware (it reads `request.user`)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        user = request.user
        user_id = user.pk if user.is_authenticated else None
        rls.request_begin(user_id=user_id, staff=_is_staff_admin_request(request))
        try:
            return self.get_response(request)
        finally:
            try:
                rls.request_end()
            except DatabaseError:
                # The reset could not run (a broken connection or transaction): drop the
                # connection rather than hand its settings to the next request.
                connection.close()
