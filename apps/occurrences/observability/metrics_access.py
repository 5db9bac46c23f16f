"""Who may read the web process's /metrics (docs/security.md "Metrics").

Metrics name queues, volumes and (bounded) tenant labels: they are for the operator's
scraper, not the public. The web app answers /metrics only to

1. a request straight from an allowed network (`TICK_METRICS_ALLOWED_NETWORKS`, default
   loopback only) — "straight": one that came through a proxy (it carries Forwarded,
   X-Forwarded-For or X-Real-IP) is never admitted by its address, since a reverse proxy on
   the same host makes every public request look like 127.0.0.1; or
2. a request with `Authorization: Bearer <TICK_METRICS_TOKEN>` (when set), compared in
   constant time.

Anyone else gets the same 404 as an unknown path, so the endpoint is not advertised.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Sequence
from functools import cache

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django_prometheus.exports import ExportToDjangoView  # type: ignore[import-untyped]

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
PROXY_HEADERS = ("HTTP_FORWARDED", "HTTP_X_FORWARDED_FOR", "HTTP_X_REAL_IP")


@cache
def _networks(cidrs: tuple[str, ...]) -> tuple[IpNetwork, ...]:
    return tuple(ipaddress.ip_network(cidr, strict=False) for cidr in cidrs)


def from_allowed_network(request: HttpRequest, cidrs: Sequence[str]) -> bool:
    if any(request.META.get(header) for header in PROXY_HEADERS):
        return False
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in _networks(tuple(cidrs)))


def has_metrics_token(request: HttpRequest, token: str) -> bool:
    if not token:
        return False
    scheme, _, presented = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(presented.strip().encode(), token.encode())


def metrics_view(request: HttpRequest) -> HttpResponse:
    """django-prometheus' exposition, for the allowed networks or the token only."""
    if not (
        from_allowed_network(request, settings.TICK_METRICS_ALLOWED_NETWORKS)
        or has_metrics_token(request, settings.TICK_METRICS_TOKEN)
    ):
        raise Http404("No such page.")
    response: HttpResponse = ExportToDjangoView(request)
    response["Cache-Control"] = "no-store"
    return response
