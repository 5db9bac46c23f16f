"""E-mail channels are confirmed by their address before they receive alerts: pending until
the mailed link's "Confirm" is pressed (a GET confirms nothing), shown in the API and the
page, the link single-use and replaced by a re-send, re-sends rate-limited."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.test import Client
from django.utils import timezone

from apps.occurrences.alerts.dispatch import group_pending
from apps.occurrences.alerts.tests.support import dead_occurrence, rule
from apps.occurrences.models import Alert, AlertChannel
from apps.tenants.models import TenantEvent
from apps.tenants.tests.mails import link_in

pytestmark = [pytest.mark.django_db, pytest.mark.clock_edge]

LINK = r"http://127\.0\.0\.1:8000(/alerts/confirm/\S+/)"


@pytest.fixture
def public_url(settings):
    settings.TICK_PUBLIC_URL = "http://127.0.0.1:8000"


def _create(api, target="ops@example.com", capture=None):
    body = {"name": "ops", "kind": "email", "target": target}
    with capture(execute=True):
        return api.post("/api/v1/alert-channels", body, format="json")


def test_an_email_channel_is_pending_and_records_nothing_until_its_address_confirms(
    api_a, tenant_a, public_url, django_capture_on_commit_callbacks
):
    created = _create(api_a, capture=django_capture_on_commit_callbacks)
    assert created.status_code == 201, created.content
    assert created.json()["confirmation"] == "pending"
    channel = AlertChannel.objects.get()
    rule(channel)
    dead_occurrence(tenant_a)
    assert not Alert.objects.exists()  # a pending channel's rules record nothing
    test = api_a.post(f"/api/v1/alert-channels/{channel.id}/test")
    assert (test.status_code, test.json()["error"]["code"]) == (409, "channel_not_confirmed")

    assert mail.outbox[0].to == ["ops@example.com"]
    link = link_in(mail.outbox[0].body, LINK)
    visitor = Client()  # whoever reads the mailbox: no Tick account needed
    page = visitor.get(link)
    assert page.status_code == 200 and "ops@example.com" in page.content.decode()
    assert api_a.get(f"/api/v1/alert-channels/{channel.id}").json()["confirmation"] == "pending"
    confirmed = visitor.post(link)
    assert "Alerts confirmed" in confirmed.content.decode()

    assert api_a.get(f"/api/v1/alert-channels/{channel.id}").json()["confirmation"] == "confirmed"
    assert visitor.post(link).status_code == 404  # single use
    dead_occurrence(tenant_a)
    assert Alert.objects.filter(channel=channel).count() == 1
    assert api_a.post(f"/api/v1/alert-channels/{channel.id}/test").status_code == 202
    actions = list(
        TenantEvent.objects.filter(kind=TenantEvent.Kind.ALERT_CHANNEL_CHANGED)
        .order_by("id")
        .values_list("detail__action", "actor")
    )
    assert actions[-1] == ("confirmed", "email:ops@example.com")


def test_a_resend_replaces_the_link_and_is_rate_limited(
    api_a, settings, public_url, django_capture_on_commit_callbacks
):
    settings.TICK_ALERT_CONFIRMATIONS_PER_HOUR = 2
    _create(api_a, capture=django_capture_on_commit_callbacks)
    channel = AlertChannel.objects.get()
    url = f"/api/v1/alert-channels/{channel.id}/confirmation"

    too_soon = api_a.post(url)
    assert (too_soon.status_code, too_soon.json()["error"]["code"]) == (429, "rate_limited")
    assert 1 <= int(too_soon["Retry-After"]) <= 60
    AlertChannel.objects.update(confirmation_sent_at=timezone.now() - timedelta(minutes=2))
    with django_capture_on_commit_callbacks(execute=True):
        resent = api_a.post(url)
    assert resent.status_code == 202 and resent.json()["confirmation"] == "pending"
    AlertChannel.objects.update(confirmation_sent_at=timezone.now() - timedelta(minutes=2))
    over_budget = api_a.post(url)  # the tenant's 2 mails this hour are spent
    assert over_budget.status_code == 429 and int(over_budget["Retry-After"]) > 3000
    assert len(mail.outbox) == 2

    first, second = (link_in(m.body, LINK) for m in mail.outbox)
    assert Client().post(first).status_code == 404  # replaced by the re-send
    assert Client().post(second).status_code == 200
    again = api_a.post(url)
    assert (again.status_code, again.json()["error"]["code"]) == (409, "already_confirmed")


def test_a_forged_or_other_tenants_link_confirms_nothing(
    api_a, public_url, django_capture_on_commit_callbacks
):
    _create(api_a, capture=django_capture_on_commit_callbacks)
    link = link_in(mail.outbox[0].body, LINK)
    for bad in (
        link[:-3] + "x/",
        "/alerts/confirm/garbage/",
        link.replace("confirm/", "confirm/a"),
    ):
        assert Client().post(bad).status_code == 404
    assert AlertChannel.objects.get().confirmed_at is None


def test_a_changed_address_confirms_again_and_webhooks_need_no_confirmation(
    api_a, tenant_a, settings, public_url, django_capture_on_commit_callbacks
):
    settings.TICK_WEBHOOK_ALLOWLIST = ["127.0.0.1/32"]
    _create(api_a, capture=django_capture_on_commit_callbacks)
    channel = AlertChannel.objects.get()
    Client().post(link_in(mail.outbox[0].body, LINK))
    with django_capture_on_commit_callbacks(execute=True):
        changed = api_a.patch(f"/api/v1/alert-channels/{channel.id}",
                              {"target": "other@example.com"}, format="json")  # fmt: skip
    assert changed.json()["confirmation"] == "pending"
    assert mail.outbox[-1].to == ["other@example.com"]
    renamed = api_a.patch(f"/api/v1/alert-channels/{channel.id}", {"name": "x"}, format="json")
    assert len(mail.outbox) == 2 and renamed.json()["confirmation"] == "pending"

    hook = api_a.post("/api/v1/alert-channels", {"name": "h", "kind": "webhook",
                      "target": "http://127.0.0.1/hook"}, format="json")  # fmt: skip
    assert hook.json()["confirmation"] == "confirmed"


def test_the_alerts_page_shows_the_state_and_resends(
    client, alice, tenant_a, public_url, django_capture_on_commit_callbacks
):
    client.force_login(alice)
    with django_capture_on_commit_callbacks(execute=True):
        added = client.post("/alerts/channels/", {"name": "ops", "kind": "email",
                            "target": "ops@example.com"}, follow=True)  # fmt: skip
    text = added.content.decode()
    assert "A confirmation link was mailed to ops@example.com" in text
    assert "pending confirmation" in text and "Re-send confirmation" in text
    assert "Send test alert" not in text
    channel = AlertChannel.objects.get()
    page = client.post(f"/alerts/channels/{channel.id}/confirmation/", follow=True)
    assert "less than 60 s ago" in page.content.decode()  # rate-limited, said so
    assert group_pending(now=timezone.now(), coalesce_s=0, interval_s=0) == (0, 0)
