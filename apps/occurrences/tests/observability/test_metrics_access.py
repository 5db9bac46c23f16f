"""The web's /metrics answers only the scraper (docs/security.md "Metrics"): straight from an
allowed network, or with the bearer token; anyone else gets a 404. Tenant labels stay on
the bounded metrics only."""

from __future__ import annotations

import pytest
from django.test import Client, override_settings
from prometheus_client import REGISTRY

TOKEN = "m" * 40
PUBLIC = "203.0.113.7"

pytestmark = pytest.mark.django_db


def _get(remote: str, **headers: str) -> int:
    return Client().get("/metrics", REMOTE_ADDR=remote, **headers).status_code  # type: ignore[arg-type]


@override_settings(TICK_METRICS_TOKEN=TOKEN)
def test_metrics_need_the_token_from_outside() -> None:
    assert _get(PUBLIC) == 404
    assert _get(PUBLIC, HTTP_AUTHORIZATION=f"Bearer {TOKEN[:-1]}x") == 404
    assert _get(PUBLIC, HTTP_AUTHORIZATION=f"Basic {TOKEN}") == 404

    response = Client().get("/metrics", REMOTE_ADDR=PUBLIC, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")

    assert response.status_code == 200
    assert b"django_http_requests" in response.content
    assert response["Cache-Control"] == "no-store"


def test_without_a_token_configured_no_bearer_opens_it() -> None:
    assert _get(PUBLIC, HTTP_AUTHORIZATION="Bearer ") == 404
    assert _get(PUBLIC, HTTP_AUTHORIZATION="Bearer") == 404


def test_loopback_is_allowed_by_default_but_not_through_a_proxy() -> None:
    assert _get("127.0.0.1") == 200
    assert _get("::1") == 200
    # a reverse proxy on the same host makes public requests come from 127.0.0.1
    assert _get("127.0.0.1", HTTP_X_FORWARDED_FOR=PUBLIC) == 404
    assert _get("127.0.0.1", HTTP_FORWARDED=f"for={PUBLIC}") == 404
    assert _get("127.0.0.1", HTTP_X_REAL_IP=PUBLIC) == 404


@override_settings(TICK_METRICS_ALLOWED_NETWORKS=["10.0.0.0/8"])
def test_a_configured_network_is_allowed_and_nothing_else() -> None:
    assert _get("10.20.30.40") == 200
    assert _get("11.0.0.1") == 404
    assert _get("127.0.0.1") == 404


def test_only_bounded_metrics_carry_a_tenant_label() -> None:
    # tick_api_throttled_requests_total: metrics.TenantLabels (first N, then "other");
    # tick_stuck_outbox_by_tenant: top N by value + "other" (docs/operations.md).
    import tickweb.ratelimit  # noqa: F401 - both register their collectors

    labelled = {
        name
        for collector, names in REGISTRY._collector_to_names.items()
        if "tenant" in getattr(collector, "_labelnames", ())
        for name in names
        if not name.endswith(("_created",))
    }
    assert labelled == {
        "tick_api_throttled_requests_total", "tick_api_throttled_requests",
        "tick_stuck_outbox_by_tenant",
    }  # fmt: skip
