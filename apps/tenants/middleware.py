"""Records signed-in sessions for the account page's session list (apps/tenants/accounts.py).

Low write rate: a session is recorded when it logs in (`session_logged_in`, Django's
`user_logged_in` hook, so every way of logging in counts: the login page, an accepted
invitation, the admin), and the middleware refreshes "last seen" at most every
TICK_SESSION_SEEN_RESOLUTION_S. The session itself remembers which key it recorded and when,
so a request in between costs no query."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from apps.tenants import rls
from apps.tenants.accounts import seen_is_stale, user_session_seen

SEEN_KEY = "tick_seen"


def _record(request: HttpRequest, user: Any) -> None:
    session = request.session
    key = session.session_key
    if not key:
        return
    now = timezone.now()
    recorded = session.get(SEEN_KEY) or [None, None]
    if recorded[0] == key and not seen_is_stale(recorded[1], now):
        return
    # Row-level security shows a user only their own session rows; a login in this request
    # has just made them the user.
    rls.user_enter(user.pk)
    user_session_seen(
        user=user, session_key=key, now=now,
        user_agent=request.headers.get("User-Agent", ""),
        ip=request.META.get("REMOTE_ADDR") or None,
    )  # fmt: skip
    session[SEEN_KEY] = [key, now.timestamp()]


def session_logged_in(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    """`user_logged_in` receiver: login() has just given the session its new key."""
    if request is not None and getattr(request, "session", None) is not None:
        _record(request, user)


class UserSessionMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        # After the view: a login or password change may have given the session a new key.
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated and hasattr(request, "session"):
            _record(request, user)
        return response
