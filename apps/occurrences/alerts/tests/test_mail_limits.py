"""Tick is no mail cannon: e-mail channel targets refuse IP literals, dotless and local hosts
(400 naming the field); test alerts are counted per tenant and hour (429 with Retry-After
beyond)."""

from __future__ import annotations

import pytest

from apps.occurrences.alerts.tests.support import channel
from apps.occurrences.models import Alert, AlertChannel

pytestmark = pytest.mark.django_db

LOCAL_ADDRESSES = ["ops@[10.0.0.5]", "ops@localhost", "ops@[127.0.0.1]", "ops@mail.internal",
                   "ops@printer.local", "ops@intranet"]  # fmt: skip


@pytest.mark.parametrize("address", LOCAL_ADDRESSES)
def test_an_email_channel_to_an_ip_literal_or_local_host_is_refused(api_a, address):
    body = {"name": "ops", "kind": "email", "target": address}
    response = api_a.post("/api/v1/alert-channels", body, format="json")
    assert response.status_code == 400, response.content
    assert "target" in response.json()["error"]["fields"]
    assert not AlertChannel.objects.exists()


def test_test_alerts_are_limited_per_tenant_and_hour(api_a, api_b, tenant_a, tenant_b, settings):
    settings.TICK_ALERT_TESTS_PER_HOUR = 3
    channels = [channel(tenant_a, f"ops{n}@example.com") for n in range(2)]
    theirs = channel(tenant_b, "ops@example.com")

    answers = [api_a.post(f"/api/v1/alert-channels/{channels[n % 2].id}/test").status_code
               for n in range(4)]  # fmt: skip

    assert answers == [202, 202, 202, 429]  # across the tenant's channels
    refused = api_a.post(f"/api/v1/alert-channels/{channels[0].id}/test")
    assert refused.json()["error"]["code"] == "rate_limited"
    assert 3500 <= int(refused["Retry-After"]) <= 3600
    assert Alert.objects.filter(tenant=tenant_a).count() == 3
    # Another tenant's budget is its own.
    assert api_b.post(f"/api/v1/alert-channels/{theirs.id}/test").status_code == 202


def test_the_test_alert_button_over_the_limit_says_so_and_records_nothing(
    client, alice, tenant_a, settings
):
    settings.TICK_ALERT_TESTS_PER_HOUR = 1
    ch = channel(tenant_a, "ops@example.com")
    client.force_login(alice)
    client.post(f"/alerts/channels/{ch.id}/test/")

    response = client.post(f"/alerts/channels/{ch.id}/test/", follow=True)

    assert "requested 1 test alerts in the last hour" in response.content.decode()
    assert Alert.objects.filter(channel=ch).count() == 1
