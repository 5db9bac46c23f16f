"""A signed-in person's own account: their sessions, and the audit trail of password changes
and "sign out everywhere" in every tenant they belong to (docs/ui.md: account)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.sessions.backends.base import SessionBase
from django.db import transaction
from django.utils import timezone

from apps.tenants import rls
from apps.tenants.models import Membership, TenantEvent, UserSession
from apps.tenants.services import log_tenant_event


def _session_store(session_key: str | None = None) -> SessionBase:
    engine = import_module(settings.SESSION_ENGINE)
    store: SessionBase = engine.SessionStore(session_key)
    return store


def user_session_seen(
    *, user: Any, session_key: str, user_agent: str, ip: str | None, now: datetime
) -> None:
    """Record (or refresh) one session of `user`. One upsert; callers limit how often."""
    UserSession.objects.update_or_create(
        session_key=session_key,
        defaults={"user": user, "user_agent": user_agent[:300], "ip": ip, "last_seen_at": now},
        create_defaults={
            "user": user, "user_agent": user_agent[:300], "ip": ip,
            "created_at": now, "last_seen_at": now,
        },
    )  # fmt: skip


@dataclass(frozen=True)
class SessionRow:
    session_key: str
    user_agent: str
    ip: str | None
    created_at: datetime
    last_seen_at: datetime
    current: bool


def user_sessions(*, user: Any, current_key: str | None) -> list[SessionRow]:
    """The user's live sessions, newest activity first. Rows whose session is gone (logged
    out, expired, ended elsewhere) are deleted on the way."""
    rows = list(UserSession.objects.filter(user=user).order_by("-last_seen_at"))
    store = _session_store()
    gone = [row.session_key for row in rows if not store.exists(row.session_key)]
    if gone:
        UserSession.objects.filter(session_key__in=gone).delete()
    return [
        SessionRow(
            row.session_key,
            row.user_agent,
            row.ip,
            row.created_at,
            row.last_seen_at,
            current=row.session_key == current_key,
        )  # fmt: skip
        for row in rows
        if row.session_key not in gone
    ]


def _log_everywhere(user: Any, kind: TenantEvent.Kind, now: datetime, **detail: Any) -> None:
    """Account-level events go to every tenant the user belongs to: each tenant's admins see
    what happened to the accounts that can reach their tenant."""
    rls.user_enter(user.pk)  # a reset link's user is not signed in yet
    for membership in Membership.objects.filter(user=user).select_related("tenant"):
        # Row-level security (apps/tenants/rls.py): each event is written as its tenant, which
        # this user's membership admits.
        rls.tenant_enter(membership.tenant_id)
        log_tenant_event(
            tenant=membership.tenant, kind=kind, actor=f"user:{user.get_username()}", now=now,
            **detail,
        )  # fmt: skip


def _end_other_sessions(user: Any, current_key: str | None) -> int:
    keys = list(
        UserSession.objects.filter(user=user)
        .exclude(session_key=current_key or "")
        .values_list("session_key", flat=True)
    )
    store = _session_store()
    ended = 0
    for key in keys:
        if store.exists(key):
            ended += 1
        store.delete(key)
    UserSession.objects.filter(session_key__in=keys).delete()
    return ended


@transaction.atomic
def user_sessions_revoke_others(*, user: Any, current_key: str | None) -> int:
    """End every session of `user` but the current one; returns how many ended. Their next
    request is anonymous (the session store no longer has them)."""
    ended = _end_other_sessions(user, current_key)
    _log_everywhere(user, TenantEvent.Kind.SESSIONS_REVOKED, timezone.now(), sessions=ended)
    return ended


@transaction.atomic
def password_changed(*, user: Any, via: str, current_key: str | None = None) -> None:
    """Audit a password change (`via`: "change" signed in, "reset" by an e-mailed link) and
    end the user's other sessions. Django already refuses them (their stored auth hash no
    longer matches); deleting them keeps the session list true."""
    rls.user_enter(user.pk)  # a reset link's user is not signed in yet: their sessions show
    _end_other_sessions(user, current_key)
    _log_everywhere(user, TenantEvent.Kind.PASSWORD_CHANGED, timezone.now(), via=via)


def seen_is_stale(last: float | None, now: datetime) -> bool:
    if last is None:
        return True
    resolution = timedelta(seconds=settings.TICK_SESSION_SEEN_RESOLUTION_S)
    return now.timestamp() - last >= resolution.total_seconds()
