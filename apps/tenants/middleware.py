"""Records signed-in sessions for the account page's session list (apps/tenants/accounts.py).

Low write rate: the session remembers which key was recorded and when, so a row is written at
login (a new session key) and then at most every TICK_SESSION_SEEN_RESOLUTION_S."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from apps.tenants.accounts import seen_is_stale, user_session_seen

SEEN_KEY = "tick_seen"


class UserSessionMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        user = getattr(request, "user", None)
        session = getattr(request, "session", None)
        # After the view: a login has just given the session its new key.
        if user is None or session is None or not user.is_authenticated:
            return response
        key = session.session_key
        if not key:
            return response
        now = timezone.now()
        recorded = session.get(SEEN_KEY) or [None, None]
        if recorded[0] != key or seen_is_stale(recorded[1], now):
            user_session_seen(
                user=user, session_key=key, now=now,
                user_agent=request.headers.get("User-Agent", ""),
                ip=request.META.get("REMOTE_ADDR") or None,
            )  # fmt: skip
            session[SEEN_KEY] = [key, now.timestamp()]
        return response
