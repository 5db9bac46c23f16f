"""Tenant and API-key operations."""

from __future__ import annotations

import hashlib
import json
import secrets
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from apps.tenants.errors import IdempotencyConflict, RefusedRequest
from apps.tenants.models import (
    MAX_ACTIVE_API_KEYS,
    ApiKey,
    IdempotencyKey,
    Membership,
    Tenant,
    TenantEvent,
)
from apps.tenants.text import refuse_control_characters

KEY_PREFIX = "tick_"
# The event logs' actor for a change made with manage.py on the server (docs/security.md
# "Event log").
OPERATOR_ACTOR = "operator"


def hash_api_key(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


def log_tenant_event(
    *,
    tenant: Tenant,
    kind: TenantEvent.Kind,
    actor: str,
    now: datetime | None = None,
    **detail: Any,
) -> TenantEvent:
    """Record `kind` in the tenant's account audit log (docs/security.md: support actions)."""
    return TenantEvent.objects.create(
        tenant=tenant, kind=kind, actor=actor, at=now or timezone.now(), detail=detail
    )


def tenant_create(*, slug: str, name: str | None = None) -> Tenant:
    """A tenant with default quotas; a name with a control character is refused
    (ValidationError), as in the admin."""
    refuse_control_characters(name or slug)
    return Tenant.objects.create(slug=slug, name=name or slug)


def _active_keys(tenant: Tenant, now: datetime) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(tenant=tenant, revoked_at__isnull=True).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=now)
    )


@transaction.atomic
def api_key_create(
    *,
    tenant: Tenant,
    name: str,
    actor: str,
    created_by: AbstractBaseUser | None = None,
    expires_at: datetime | None = None,
    role: Membership.Role = Membership.Role.ADMIN,
) -> tuple[ApiKey, str]:
    """Create a key; returns the row and the raw key, which is never retrievable again.
    A viewer key reads every API route and changes nothing (docs/api.md "Keys and roles").

    `created_by` is the member it belongs to (None: an operator's key); `api_key_created` is
    logged with `actor`. Refused: a name with a control character (ValidationError), and a
    key beyond MAX_ACTIVE_API_KEYS (RefusedRequest, checked under the tenant's row lock)."""
    refuse_control_characters(name)
    Tenant.objects.select_for_update(no_key=True).filter(pk=tenant.pk).values_list("pk").get()
    now = timezone.now()
    if _active_keys(tenant, now).count() >= MAX_ACTIVE_API_KEYS:
        raise RefusedRequest(
            f"This tenant already has {MAX_ACTIVE_API_KEYS} active API keys, the most it may "
            "hold: revoke one it no longer uses first.",
            field="name",
        )
    raw = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(
        tenant=tenant,
        name=name,
        prefix=raw[: len(KEY_PREFIX) + 8],
        key_hash=hash_api_key(raw),
        expires_at=expires_at,
        role=role,
        created_by_id=created_by.pk if created_by is not None else None,
    )
    log_tenant_event(
        tenant=tenant, kind=TenantEvent.Kind.API_KEY_CREATED, actor=actor, now=now,
        prefix=key.prefix, name=name, role=str(role),
        owner=created_by.get_username() if created_by is not None else None,
        expires_at=_iso_or_none(expires_at),
    )  # fmt: skip
    return key, raw


def _log_revoked(keys: list[ApiKey], *, actor: str, now: datetime, **detail: Any) -> None:
    for key in keys:
        key.revoked_at = now
        log_tenant_event(
            tenant=key.tenant, kind=TenantEvent.Kind.API_KEY_REVOKED, actor=actor, now=now,
            prefix=key.prefix, name=key.name, **detail,
        )  # fmt: skip


def _revoke_locked(
    keys: QuerySet[ApiKey], *, actor: str, now: datetime, **detail: Any
) -> list[ApiKey]:
    """Revoke the unrevoked keys of `keys` (locked, so a concurrent revoke is not logged
    twice); one `api_key_revoked` event per key revoked. Revocation is one-way."""
    locked = list(
        keys.select_for_update(of=("self",))
        .select_related("tenant")
        .filter(revoked_at__isnull=True)
        .order_by("pk")
    )
    ApiKey.objects.filter(pk__in=[k.pk for k in locked]).update(revoked_at=now)
    _log_revoked(locked, actor=actor, now=now, **detail)
    return locked


@transaction.atomic
def member_keys_revoke(
    *,
    tenant_id: uuid.UUID,
    user_id: int,
    actor: str,
    reason: str,
    roles: Collection[str] | None = None,
    now: datetime | None = None,
) -> list[ApiKey]:
    """Revoke the keys a member created in a tenant (only those of `roles` when given): on
    removal all of them, on demotion the ones above the new role. Each revocation is logged
    with `reason` (`member_removed`, `member_demoted`)."""
    keys = ApiKey.objects.filter(tenant_id=tenant_id, created_by_id=user_id)
    if roles is not None:
        keys = keys.filter(role__in=list(roles))
    return _revoke_locked(keys, actor=actor, now=now or timezone.now(), reason=reason)


@transaction.atomic
def membership_grant(
    *, user: AbstractBaseUser, tenant: Tenant, role: str = Membership.Role.ADMIN
) -> Membership:
    membership, _ = Membership.objects.update_or_create(
        user=user, tenant=tenant, defaults={"role": role}
    )
    return membership


DEMO_PASSWORD = "tick-demo"  # noqa: S105 - the documented local-only demo login


def demo_user_ensure(
    *, username: str, password: str | None, allow_known_password: bool
) -> tuple[AbstractBaseUser, str | None]:
    """The demo login (a superuser), created once; returns it and the password set by this
    call (None when an existing password was kept, so a rerun never resets it).

    With `allow_known_password` off (DJANGO_DEBUG off) the documented DEMO_PASSWORD is
    refused: no password given means a random one, and an existing login still on the
    known password gets a random one (docs/security.md "Demo login")."""
    if password == DEMO_PASSWORD and not allow_known_password:
        raise ValidationError(f"Refusing the known demo password {DEMO_PASSWORD!r} with DEBUG off.")
    wanted = password or (DEMO_PASSWORD if allow_known_password else None)
    user_model = get_user_model()
    user, created = user_model.objects.get_or_create(username=username)
    new_password: str | None = None
    if created:
        new_password = wanted or secrets.token_urlsafe(18)
    elif not allow_known_password and user.check_password(DEMO_PASSWORD):
        new_password = secrets.token_urlsafe(18)
    if new_password is not None:
        user.set_password(new_password)
        user.save(update_fields=["password"])
    return user, new_password


@transaction.atomic
def api_key_revoke(*, prefix: str, actor: str, now: datetime | None = None) -> list[ApiKey]:
    """Revoke every unrevoked key with this visible prefix, each logged; returns them.
    Authentication refuses revoked keys on the next request (no cache)."""
    return _revoke_locked(
        ApiKey.objects.filter(prefix=prefix), actor=actor, now=now or timezone.now()
    )


# --------------------------------------------------------------------------------------------
# Support staff's account changes (the admin), each written to the tenant's event log
# --------------------------------------------------------------------------------------------


@transaction.atomic
def api_keys_revoke(
    *, key_ids: list[uuid.UUID], actor: str, now: datetime | None = None
) -> list[ApiKey]:
    """Revoke the unrevoked keys among `key_ids` (the admin's action, demo_setup's previous
    key): locked, so a concurrent revoke is not logged twice; one `api_key_revoked` event
    per key revoked. Revocation is one-way."""
    return _revoke_locked(
        ApiKey.objects.filter(pk__in=key_ids), actor=actor, now=now or timezone.now()
    )


def api_key_expiry_check(*, current: datetime | None, wanted: datetime | None) -> None:
    """An expiry may only be brought forward: a key never lives longer than it was given."""
    if current is None:
        return
    if wanted is None:
        raise ValidationError(
            "This key already expires; an expiry can only be brought forward, not removed."
        )
    if wanted > current:
        raise ValidationError(
            "An expiry can only be brought forward: choose a time before "
            f"{current:%Y-%m-%d %H:%M:%S} UTC, or revoke the key and create a new one."
        )


@transaction.atomic
def api_key_expiry_shorten(
    *, key: ApiKey, expires_at: datetime, actor: str, now: datetime | None = None
) -> ApiKey:
    """Bring `key`'s expiry forward to `expires_at` (refused if later than the current one)
    and log `api_key_expiry_shortened` with both times."""
    locked = ApiKey.objects.select_for_update().select_related("tenant").get(pk=key.pk)
    api_key_expiry_check(current=locked.expires_at, wanted=expires_at)
    previous = locked.expires_at
    locked.expires_at = expires_at
    locked.save(update_fields=["expires_at"])
    log_tenant_event(
        tenant=locked.tenant, kind=TenantEvent.Kind.API_KEY_EXPIRY_SHORTENED, actor=actor,
        now=now, prefix=locked.prefix, previous=_iso_or_none(previous),
        expires_at=expires_at.isoformat(),
    )  # fmt: skip
    return locked


def tenant_settings_log(
    *, tenant: Tenant, changes: dict[str, tuple[Any, Any]], actor: str
) -> TenantEvent | None:
    """Log a change of the tenant's settings or quotas (`field: [before, after]`)."""
    if not changes:
        return None
    return log_tenant_event(
        tenant=tenant, kind=TenantEvent.Kind.SETTINGS_CHANGED, actor=actor,
        changes={field: [before, after] for field, (before, after) in sorted(changes.items())},
    )  # fmt: skip


def _iso_or_none(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


# --------------------------------------------------------------------------------------------
# API request rate: one fixed window per tenant, counted in PostgreSQL
# --------------------------------------------------------------------------------------------

RATE_WINDOW_S = 60

# One upsert per request: a new window resets the count, the same window increments it. The
# row lock it takes serialises one tenant's concurrent requests for microseconds only.
_RATE_HIT = """
    INSERT INTO tenants_apiratewindow (tenant_id, window_start, count)
    VALUES (%s, %s, 1)
    ON CONFLICT (tenant_id) DO UPDATE
    SET count = CASE WHEN tenants_apiratewindow.window_start = EXCLUDED.window_start
                     THEN tenants_apiratewindow.count + 1 ELSE 1 END,
        window_start = EXCLUDED.window_start
    RETURNING count
"""


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    count: int
    limit: int
    retry_after_s: int


def api_rate_hit(*, tenant: Tenant, limit_per_min: int, now: datetime) -> RateDecision:
    """Count one API request of `tenant` (any of its keys) in the current minute; refuse
    beyond the limit. Per tenant, not per key: more keys buy no more requests."""
    epoch = int(now.timestamp())
    start = epoch - epoch % RATE_WINDOW_S
    window_start = datetime.fromtimestamp(start, tz=now.tzinfo)
    with connection.cursor() as cursor:
        cursor.execute(_RATE_HIT, [tenant.pk, window_start])
        row = cursor.fetchone()
    count = int(row[0]) if row else 1
    retry_after = max(1, start + RATE_WINDOW_S - epoch)
    return RateDecision(count <= limit_per_min, count, limit_per_min, retry_after)


# --------------------------------------------------------------------------------------------
# Idempotency keys
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IdempotentResponse:
    status: int
    body: Any
    replayed: bool


def idempotency_request_hash(*, method: str, path: str, data: Any) -> str:
    """ "Same body" = same method, path and JSON value (key order and spacing do not count)."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{method} {path}\n{canonical}".encode()).hexdigest()


def _expired(row: IdempotencyKey, now: datetime) -> bool:
    return now - row.created_at > timedelta(seconds=settings.TICK_IDEMPOTENCY_TTL_S)


def _replay(row: IdempotencyKey, request_hash: str) -> IdempotentResponse:
    if row.request_hash != request_hash:
        raise IdempotencyConflict(
            "This Idempotency-Key was already used with a different request body; use a new "
            "key for a different request.",
            field="Idempotency-Key",
        )
    assert row.status_code is not None
    return IdempotentResponse(row.status_code, row.response, replayed=True)


def idempotency_lookup(
    *, tenant: Tenant, key: str, request_hash: str, now: datetime
) -> IdempotentResponse | None:
    """The stored first response for this key (same body), a conflict (other body), or None.

    Checked before validation, so a retry replays its first answer even if the same body
    would no longer validate (e.g. a one-shot's run_at has passed meanwhile)."""
    row = IdempotencyKey.objects.filter(tenant=tenant, key=key).first()
    if row is None or row.status_code is None or _expired(row, now):
        return None
    return _replay(row, request_hash)


def idempotent_call(
    *,
    tenant: Tenant,
    key: str,
    request_hash: str,
    call: Callable[[], tuple[int, Any]],
) -> IdempotentResponse:
    """Run `call` at most once per (tenant, key) and remember its successful response.

    1. Insert the key's row if absent, in its own short transaction (`ON CONFLICT DO
       NOTHING`): every concurrent retry now has one row to queue on.
    2. In the call's transaction, lock that row. The first holder runs `call` and stores its
       status and body before commit; the others wait on the lock, then find the stored
       response and replay it (or 409 for another body).
    3. If `call` raises, the transaction rolls back and nothing is stored: the key stays
       usable (a refused request did not "spend" it).
    """
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO tenants_idempotencykey (tenant_id, key, request_hash, created_at) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT (tenant_id, key) DO NOTHING",
            [tenant.pk, key, request_hash, now],
        )
    with transaction.atomic():
        row = IdempotencyKey.objects.select_for_update().get(tenant=tenant, key=key)
        if row.status_code is not None and not _expired(row, now):
            return _replay(row, request_hash)
        status, body = call()
        row.request_hash, row.status_code, row.response, row.created_at = (
            request_hash, status, body, now,
        )  # fmt: skip
        row.save(update_fields=["request_hash", "status_code", "response", "created_at"])
    return IdempotentResponse(status, body, replayed=False)


def idempotency_purge(*, now: datetime, limit: int = 10_000) -> int:
    """Delete up to `limit` expired idempotency rows; returns how many."""
    cutoff = now - timedelta(seconds=settings.TICK_IDEMPOTENCY_TTL_S)
    ids = list(
        IdempotencyKey.objects.filter(created_at__lt=cutoff)
        .order_by("created_at")
        .values_list("id", flat=True)[:limit]
    )
    deleted, _ = IdempotencyKey.objects.filter(id__in=ids).delete()
    return deleted


# --------------------------------------------------------------------------------------------
# Web UI (docs/ui.md): tenant-scoped key revocation
# --------------------------------------------------------------------------------------------


@transaction.atomic
def api_key_revoke_for_tenant(
    *, tenant: Tenant, key_id: uuid.UUID | str, actor: str, now: datetime | None = None
) -> ApiKey | None:
    """Revoke one key of `tenant` by id, logged; None if the tenant has no such key (another
    tenant's id included). Revoking twice keeps the first revocation time (and one event)."""
    try:
        key = ApiKey.objects.get(tenant=tenant, id=key_id)
    except (ApiKey.DoesNotExist, ValueError, TypeError, ValidationError):
        return None
    _revoke_locked(ApiKey.objects.filter(pk=key.pk), actor=actor, now=now or timezone.now())
    key.refresh_from_db(fields=["revoked_at"])
    return key
