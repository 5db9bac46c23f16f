"""DRF authentication by tenant API key (`Authorization: Bearer <key>`), and the API's tenancy
door: `principal_of(request)` is the caller's tenant and key in every tenant API view."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from apps.tenants import rls
from apps.tenants.models import ApiKey, Membership, Tenant
from apps.tenants.services import hash_api_key

# last_used_at is refreshed at most this often, so a busy key does not write every request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class TenantPrincipal:
    """The caller of a tenant API request: which tenant, and which key (for the audit log)."""

    is_authenticated = True

    def __init__(self, tenant: Tenant, api_key: ApiKey) -> None:
        self.tenant = tenant
        self.api_key = api_key

    @property
    def actor(self) -> str:
        return f"api-key:{self.api_key.prefix}"


def principal_of(request: Request) -> TenantPrincipal:
    """The caller of a tenant API view (let in by IsTenantAuthenticated)."""
    if not isinstance(request.user, TenantPrincipal):
        raise exceptions.NotAuthenticated()
    return request.user


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[TenantPrincipal, ApiKey] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme != self.keyword or not raw.strip():
            raise exceptions.AuthenticationFailed("Use 'Authorization: Bearer <api key>'.")
        now = timezone.now()
        key_hash = hash_api_key(raw.strip())
        # Row-level security shows this one key (and its tenant) before the tenant is known.
        rls.lookup_present(rls.API_KEY_HASH_SETTING, key_hash)
        key = (
            ApiKey.objects.select_related("tenant")
            .filter(key_hash=key_hash, revoked_at__isnull=True)
            .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
            .first()
        )
        if key is None:
            raise exceptions.AuthenticationFailed("Unknown, revoked or expired API key.")
        rls.tenant_enter(key.tenant_id)
        if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
            ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        return TenantPrincipal(key.tenant, key), key

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class IsTenantAuthenticated(permissions.BasePermission):
    """A tenant's API key; only an admin key changes anything (docs/api.md "Keys and roles").

    A view that must answer 404 for another tenant's id before the role's 403 sets
    `checks_key_role = True` and checks the role itself after its tenant door."""

    def has_permission(self, request: Request, view: Any) -> bool:
        principal = request.user
        if not isinstance(principal, TenantPrincipal):
            return False
        if request.method in permissions.SAFE_METHODS or getattr(view, "checks_key_role", False):
            return True
        if principal.api_key.role != Membership.Role.ADMIN:
            raise exceptions.PermissionDenied(
                "This API key has the viewer role: it reads and changes nothing. Use an admin key."
            )
        return True


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """Documents the bearer API key in the OpenAPI schema (drf-spectacular)."""

    target_class = "apps.tenants.authentication.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A tenant API key: `Authorization: Bearer tick_…`.",
        }
