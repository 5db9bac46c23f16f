"""Per-tenant API request rate limiting (DRF throttle): a fixed one-minute window per tenant,
all its keys together, counted in PostgreSQL (`apps.tenants.services.api_rate_hit`), so
every web process of the installation shares one count and a second key buys no more
requests. Beyond `Tenant.api_rate_per_min` the request is refused with 429 and
`Retry-After` (seconds to the next window) and counted.

Rejected: DRF's cache-backed throttles (per-process with the default local-memory cache, so
N gunicorn workers would allow N× the limit) and an in-process token bucket (same flaw).
A fixed window can admit up to 2× the limit across a window edge; that is acceptable for
abuse protection and keeps one row per tenant.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils import timezone
from prometheus_client import Counter
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from apps.occurrences.observability.metrics import TenantLabels
from apps.tenants.authentication import TenantPrincipal
from apps.tenants.services import api_rate_hit

# Bounded cardinality: the first N tenants seen keep their label, the rest are "other".
_tenant_label = TenantLabels(settings.TICK_METRICS_TOP_TENANTS)
throttled_requests = Counter(
    "tick_api_throttled_requests_total",
    "API requests refused with 429 by the tenant's API rate limit.",
    ["tenant"],
)


class ApiKeyRateThrottle(BaseThrottle):
    def __init__(self) -> None:
        self._retry_after: float | None = None

    def allow_request(self, request: Request, view: Any) -> bool:
        principal = request.user
        if not isinstance(principal, TenantPrincipal):
            return True  # unauthenticated requests are refused by the permission check
        decision = api_rate_hit(
            tenant=principal.tenant,
            limit_per_min=principal.tenant.api_rate_per_min,
            now=timezone.now(),
        )
        if not decision.allowed:
            self._retry_after = decision.retry_after_s
            throttled_requests.labels(tenant=_tenant_label(principal.tenant.slug)).inc()
        return decision.allowed

    def wait(self) -> float | None:
        return self._retry_after
