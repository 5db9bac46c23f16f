"""Webhook signing secrets of a tenant, and the signature every webhook call carries.

Scheme: Standard Webhooks (https://www.standardwebhooks.com/, docs/webhooks.md). A secret is
`whsec_` + base64 of 32 random bytes; the signature of one call is

    base64(HMAC-SHA256(key=the 32 bytes, msg=f"{webhook-id}.{webhook-timestamp}.{body}"))

sent as `webhook-signature: v1,<sig>` — one `v1,<sig>` per active secret, space-separated,
the newest first, so a receiver that knows either secret of a rotation verifies.

Storage: the worker needs the secret itself, so it is encrypted at rest with Fernet
(`cryptography`): TICK_SIGNING_KEYS, else a key derived (HKDF-SHA256) from SECRET_KEY and
SECRET_KEY_FALLBACKS. A database dump alone reveals no secret.

Concurrency: rotate, revoke and the first secret's creation lock the tenant row, so "at most
two active" and "never zero active after a revoke" hold against concurrent requests and
workers.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import uuid
from datetime import datetime, timedelta

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q, QuerySet
from django.http import Http404
from django.utils import timezone

from apps.tenants.errors import LastSigningSecret, RotationInProgress, SigningUnavailable
from apps.tenants.models import SigningSecret, Tenant, TenantEvent
from apps.tenants.services import log_tenant_event

SECRET_PREFIX = "whsec_"  # noqa: S105 - the public format marker, not a secret
SECRET_BYTES = 32
SIGNATURE_VERSION = "v1"
HEADER_ID = "webhook-id"
HEADER_TIMESTAMP = "webhook-timestamp"
HEADER_SIGNATURE = "webhook-signature"
SIGNATURE_HEADERS = frozenset({HEADER_ID, HEADER_TIMESTAMP, HEADER_SIGNATURE})
MAX_ACTIVE = 2
LIST_LIMIT = 100
# The actor of a secret created because a webhook needed one before any rotation.
SYSTEM_ACTOR = "system:webhook"


# --------------------------------------------------------------------------------------------
# Encryption at rest
# --------------------------------------------------------------------------------------------


def _derived_key(secret_key: str) -> bytes:
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"tick signing secrets")
    return base64.urlsafe_b64encode(hkdf.derive(secret_key.encode()))


def _fernet() -> MultiFernet:
    """The first configured key encrypts; every configured and derived key decrypts."""
    keys = [key.encode() for key in settings.TICK_SIGNING_KEYS]
    keys.append(_derived_key(settings.SECRET_KEY))
    keys.extend(_derived_key(old) for old in getattr(settings, "SECRET_KEY_FALLBACKS", []))
    return MultiFernet([Fernet(key) for key in keys])


def encrypt_secret(raw: str) -> str:
    return _fernet().encrypt(raw.encode()).decode()


def decrypt_secret(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        raise SigningUnavailable(
            "a webhook signing secret cannot be decrypted with TICK_SIGNING_KEYS / SECRET_KEY; "
            "restore the key it was encrypted with (docs/webhooks.md)"
        ) from None


def signing_secrets_reencrypt() -> int:
    """Re-encrypt every stored secret with the first configured key (`manage.py
    signing_keys_reencrypt`), so an older key can then be removed from TICK_SIGNING_KEYS.
    Each row is rewritten only if unchanged since it was read (no lock needed); returns how
    many were rewritten. Raises SigningUnavailable if a row no configured key decrypts."""
    fernet = _fernet()
    rewritten = 0
    rows = SigningSecret.objects.order_by("pk").values_list("pk", "secret_encrypted")
    for pk, token in rows.iterator(chunk_size=500):
        try:
            fresh = fernet.rotate(token.encode()).decode()
        except InvalidToken:
            raise SigningUnavailable(f"signing secret {pk} cannot be decrypted") from None
        rewritten += SigningSecret.objects.filter(pk=pk, secret_encrypted=token).update(
            secret_encrypted=fresh
        )
    return rewritten


def secret_key_bytes(raw: str) -> bytes:
    """The HMAC key of a `whsec_…` secret (Standard Webhooks: base64 after the prefix)."""
    return base64.b64decode(raw.removeprefix(SECRET_PREFIX))


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


def _active(queryset: QuerySet[SigningSecret], now: datetime) -> QuerySet[SigningSecret]:
    return queryset.filter(revoked_at__isnull=True).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=now)
    )


def signing_secrets_of(*, tenant: Tenant) -> list[SigningSecret]:
    """The tenant's secrets, newest first (the most recent LIST_LIMIT)."""
    return list(
        SigningSecret.objects.filter(tenant=tenant).order_by("-created_at", "-id")[:LIST_LIMIT]
    )


def access_signing_secret(*, tenant: Tenant, secret_id: uuid.UUID | str) -> SigningSecret:
    """The tenant's secret, or 404 — also for another tenant's id (never 403, never data)."""
    try:
        return SigningSecret.objects.get(tenant=tenant, id=secret_id)
    except (SigningSecret.DoesNotExist, ValueError, TypeError, ValidationError):
        raise Http404("No such signing secret.") from None


# --------------------------------------------------------------------------------------------
# Rotate, revoke
# --------------------------------------------------------------------------------------------


def _lock_tenant(tenant_id: uuid.UUID) -> Tenant:
    return Tenant.objects.select_for_update().get(pk=tenant_id)


def _create(tenant: Tenant, now: datetime) -> tuple[SigningSecret, str]:
    raw = SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()
    row = SigningSecret.objects.create(
        tenant=tenant,
        prefix=raw[: len(SECRET_PREFIX) + 6],
        secret_encrypted=encrypt_secret(raw),
        created_at=now,
    )
    return row, raw


def signing_secret_rotate(
    *,
    tenant: Tenant,
    actor: str,
    previous_expires_in_s: int | None = None,
    now: datetime | None = None,
) -> tuple[SigningSecret, str]:
    """Create a new current secret; returns it and its raw value (never retrievable again).

    1. Lock the tenant row: rotations, revocations and the worker's first-secret creation
       of one tenant run one at a time.
    2. Two secrets active already (a rotation in progress): refuse (409), nothing changes.
    3. The current secret, if any, becomes the previous one: it expires after
       `previous_expires_in_s` (default TICK_SIGNING_ROTATION_OVERLAP_S) and signs until then.
    4. Log `signing_secret_rotated` (or `_created` when there was none).
    """
    now = now or timezone.now()
    overlap_s = (
        settings.TICK_SIGNING_ROTATION_OVERLAP_S
        if previous_expires_in_s is None
        else previous_expires_in_s
    )
    with transaction.atomic():
        locked = _lock_tenant(tenant.pk)
        active = list(_active(locked.signing_secrets.all(), now).order_by("-created_at"))
        if len(active) >= MAX_ACTIVE:
            previous = active[-1]
            until = previous.expires_at.isoformat() if previous.expires_at else "its revocation"
            raise RotationInProgress(
                f"A rotation is in progress: {previous.prefix}… still signs until {until}. "
                f"Revoke {previous.prefix}… once your receivers use the newer secret, then "
                "rotate again."
            )
        row, raw = _create(locked, now)
        if not active:
            log_tenant_event(
                tenant=locked, kind=TenantEvent.Kind.SIGNING_SECRET_CREATED, actor=actor,
                now=now, secret=row.prefix,
            )  # fmt: skip
            return row, raw
        current = active[0]
        current.expires_at = now + timedelta(seconds=overlap_s)
        current.save(update_fields=["expires_at"])
        log_tenant_event(
            tenant=locked, kind=TenantEvent.Kind.SIGNING_SECRET_ROTATED, actor=actor, now=now,
            secret=row.prefix, previous=current.prefix,
            previous_expires_at=current.expires_at.isoformat(),
        )  # fmt: skip
    return row, raw


def signing_secret_revoke(
    *, tenant: Tenant, secret_id: uuid.UUID | str, actor: str, now: datetime | None = None
) -> SigningSecret:
    """Revoke one of the tenant's secrets (404 for another tenant's id).

    Revoking an expired or revoked secret changes nothing (the first revocation time stays).
    Revoking the only active secret is refused (409): rotate first. Revoking the newer of two
    active secrets cancels the rotation: the previous one is current again (no expiry).
    """
    now = now or timezone.now()
    with transaction.atomic():
        locked = _lock_tenant(tenant.pk)
        secret = access_signing_secret(tenant=locked, secret_id=secret_id)
        if secret.status_at(now) != SigningSecret.Status.ACTIVE:
            return secret
        others = list(_active(locked.signing_secrets.exclude(pk=secret.pk), now))
        if not others:
            raise LastSigningSecret(
                f"{secret.prefix}… is the only active signing secret; rotate first, then "
                "revoke it once your receivers use the new one."
            )
        secret.revoked_at = now
        secret.save(update_fields=["revoked_at"])
        detail: dict[str, str] = {"secret": secret.prefix}
        remaining = others[0]
        if (
            len(others) == 1
            and remaining.expires_at is not None
            and remaining.created_at < secret.created_at
        ):
            remaining.expires_at = None
            remaining.save(update_fields=["expires_at"])
            detail["current_again"] = remaining.prefix
        log_tenant_event(
            tenant=locked, kind=TenantEvent.Kind.SIGNING_SECRET_REVOKED, actor=actor, now=now,
            **detail,
        )  # fmt: skip
    return secret


# --------------------------------------------------------------------------------------------
# Signing (the worker's side)
# --------------------------------------------------------------------------------------------


def _active_raw_secrets(tenant_id: uuid.UUID, now: datetime) -> list[str]:
    rows = _active(SigningSecret.objects.filter(tenant_id=tenant_id), now).order_by("-created_at")
    return [decrypt_secret(token) for token in rows.values_list("secret_encrypted", flat=True)]


def signing_keys_for_send(*, tenant_id: uuid.UUID, now: datetime) -> list[bytes]:
    """The HMAC keys of the tenant's active secrets, newest first. A tenant without one gets
    its first secret here (created once, under the tenant row lock), so no call goes unsigned;
    its admins see it listed and rotate to obtain a secret they can copy."""
    raws = _active_raw_secrets(tenant_id, now)
    if not raws:
        with transaction.atomic():
            locked = _lock_tenant(tenant_id)
            raws = _active_raw_secrets(tenant_id, now)
            if not raws:
                row, raw = _create(locked, now)
                log_tenant_event(
                    tenant=locked, kind=TenantEvent.Kind.SIGNING_SECRET_CREATED,
                    actor=SYSTEM_ACTOR, now=now, secret=row.prefix,
                )  # fmt: skip
                raws = [raw]
    return [secret_key_bytes(raw) for raw in raws]


def signature(*, key: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    """One `v1,<base64 HMAC-SHA256>` over `<id>.<timestamp>.<body>` (the exact body bytes)."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return f"{SIGNATURE_VERSION},{base64.b64encode(digest).decode()}"


def webhook_signature_headers(
    *, tenant_id: uuid.UUID, message_id: str, body: bytes, now: datetime | None = None
) -> dict[str, str]:
    """`webhook-id`, `webhook-timestamp` and `webhook-signature` for one call of `body`."""
    now = now or timezone.now()
    timestamp = int(now.timestamp())
    keys = signing_keys_for_send(tenant_id=tenant_id, now=now)
    return {
        HEADER_ID: message_id,
        HEADER_TIMESTAMP: str(timestamp),
        HEADER_SIGNATURE: " ".join(
            signature(key=key, message_id=message_id, timestamp=timestamp, body=body)
            for key in keys
        ),
    }
