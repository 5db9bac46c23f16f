"""Tenant and API-key operations."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from apps.tenants.models import ApiKey, Membership, Tenant

KEY_PREFIX = "tick_"


def hash_api_key(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


def tenant_create(*, slug: str, name: str | None = None) -> Tenant:
    return Tenant.objects.create(slug=slug, name=name or slug)


def api_key_create(
    *, tenant: Tenant, name: str, expires_at: datetime | None = None
) -> tuple[ApiKey, str]:
    """Create a key; returns the row and the raw key, which is never retrievable again."""
    raw = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(
        tenant=tenant,
        name=name,
        prefix=raw[: len(KEY_PREFIX) + 8],
        key_hash=hash_api_key(raw),
        expires_at=expires_at,
    )
    return key, raw


@transaction.atomic
def membership_grant(
    *, user: AbstractBaseUser, tenant: Tenant, role: str = Membership.Role.ADMIN
) -> Membership:
    membership, _ = Membership.objects.update_or_create(
        user=user, tenant=tenant, defaults={"role": role}
    )
    return membership


def demo_user_ensure(*, username: str, password: str) -> AbstractBaseUser:
    user_model = get_user_model()
    user, created = user_model.objects.get_or_create(username=username)
    if created:
        user.set_password(password)
        user.save(update_fields=["password"])
    return user
