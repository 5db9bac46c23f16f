"""The Alerts page: channels, rules and history for the tenant's members; admins change,
viewers only look; the domain's field errors shown under the fields; the test alert button
records a TEST alert that the reaper's grouping turns into a message, listed in the history."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.contrib.messages import get_messages
from django.utils import timezone

from apps.occurrences.alerts.dispatch import group_pending
from apps.occurrences.alerts.tests.support import channel, rule
from apps.occurrences.models import Alert, AlertChannel, AlertDelivery, AlertEvent, AlertRule
from apps.schedules.tests.factories import make_schedule

pytestmark = pytest.mark.django_db


def test_page_lists_only_the_tenants_channels_rules_and_alerts(client, alice, tenant_a, tenant_b):
    mine = channel(tenant_a, "ops@example.com")
    rule(mine)
    theirs = channel(tenant_b, "them@example.com")
    rule(theirs)
    Alert.objects.create(id=uuid.uuid4(), tenant=tenant_b, channel=theirs, event=AlertEvent.TEST,
                         subject="their test", fired_at=timezone.now())  # fmt: skip
    client.force_login(alice)

    response = client.get("/alerts/")

    assert response.status_code == 200
    assert [c.id for c in response.context["channels"]] == [mine.id]
    assert [r.channel_id for r in response.context["rules"]] == [mine.id]
    assert response.context["history"] == []
    assert b"them@example.com" not in response.content
    assert b'href="/alerts/" aria-current="page"' in response.content


def test_admin_adds_a_channel_and_a_lag_rule(client, alice, tenant_a):
    job = make_schedule(tenant_a, name="nightly export")
    client.force_login(alice)

    added = client.post("/alerts/channels/", {"name": "ops", "kind": "email",
                                              "target": "ops@example.com"})  # fmt: skip
    ch = AlertChannel.objects.get(tenant=tenant_a)
    rule_added = client.post("/alerts/rules/", {
        "event": "start_lag", "channel_id": str(ch.id), "schedule_id": str(job.id),
        "threshold_s": "30", "window_minutes": "3",
    })  # fmt: skip

    assert (added.status_code, added["Location"]) == (302, "/alerts/")
    assert (ch.name, ch.kind, ch.target, ch.enabled) == ("ops", "email", "ops@example.com", True)
    assert rule_added.status_code == 302
    saved = AlertRule.objects.get(tenant=tenant_a)
    assert (saved.event, saved.schedule_id, saved.threshold_s, saved.window_minutes) == (
        "start_lag", job.id, 30, 3,
    )  # fmt: skip
    page = client.get("/alerts/")
    assert "nightly export" in page.content.decode()
    assert "p95 &gt; 30 s for 3 min" in page.content.decode()


def test_forms_show_the_domains_errors_under_their_fields(client, alice, tenant_a):
    client.force_login(alice)

    bad_mail = client.post("/alerts/channels/", {"name": "ops", "kind": "email",
                                                 "target": "nobody"})  # fmt: skip
    private = client.post("/alerts/channels/", {"name": "hook", "kind": "webhook",
                                                "target": "http://192.168.1.10/alert"})  # fmt: skip
    ch = channel(tenant_a, "ops@example.com")
    lag_on_dead = client.post(
        "/alerts/rules/",
        {"event": "occurrence_dead", "channel_id": str(ch.id), "threshold_s": "10"},
    )

    assert bad_mail.status_code == 400
    assert bad_mail.context["channel_form"].errors["target"] == ["Enter a valid e-mail address."]
    assert private.status_code == 400 and "target" in private.context["channel_form"].errors
    assert AlertChannel.objects.filter(tenant=tenant_a).count() == 1
    assert lag_on_dead.status_code == 400
    assert "lag rules" in lag_on_dead.context["rule_form"].errors["threshold_s"][0]
    html = lag_on_dead.content.decode()
    assert 'class="field invalid" data-field="threshold_s"' in html
    assert not AlertRule.objects.exists()


def test_enable_disable_and_delete(client, alice, tenant_a):
    ch = channel(tenant_a, "ops@example.com")
    r = rule(ch)
    client.force_login(alice)

    said = [
        [str(m) for m in get_messages(client.post(url).wsgi_request)][-1]  # not yet shown
        for url in (
            f"/alerts/rules/{r.id}/toggle/",
            f"/alerts/channels/{ch.id}/toggle/",
            f"/alerts/channels/{ch.id}/toggle/",
        )
    ]
    r.refresh_from_db()
    ch.refresh_from_db()
    assert (r.enabled, ch.enabled) == (False, True)
    assert said == [
        f"Rule {r.get_event_display()} disabled.",
        "Channel “ops@example.com” disabled: its rules record nothing.",
        "Channel “ops@example.com” enabled.",
    ]

    client.post(f"/alerts/rules/{r.id}/delete/")
    assert not AlertRule.objects.exists()
    client.post(f"/alerts/channels/{ch.id}/delete/")
    assert not AlertChannel.objects.exists()


def test_viewer_sees_the_page_but_cannot_change_anything(client, bob, tenant_a):
    ch = channel(tenant_a, "ops@example.com")
    r = rule(ch)
    client.force_login(bob)

    page = client.get("/alerts/")
    assert page.status_code == 200
    assert b"ops@example.com" in page.content
    assert b"Send test alert" not in page.content and b'id="channel-form"' not in page.content

    for url, data in [
        ("/alerts/channels/", {"name": "x", "kind": "email", "target": "x@example.com"}),
        (f"/alerts/channels/{ch.id}/toggle/", {}),
        (f"/alerts/channels/{ch.id}/delete/", {}),
        (f"/alerts/channels/{ch.id}/test/", {}),
        ("/alerts/rules/", {"event": "occurrence_dead", "channel_id": str(ch.id)}),
        (f"/alerts/rules/{r.id}/toggle/", {}),
        (f"/alerts/rules/{r.id}/delete/", {}),
    ]:
        assert client.post(url, data).status_code == 403, url
    ch.refresh_from_db()
    assert ch.enabled and AlertRule.objects.filter(id=r.id, enabled=True).exists()
    assert AlertChannel.objects.count() == 1 and not Alert.objects.exists()


def test_another_tenants_channel_and_rule_are_not_found(client, alice, tenant_b):
    theirs = channel(tenant_b, "them@example.com")
    their_rule = rule(theirs)
    client.force_login(alice)

    for url in [
        f"/alerts/channels/{theirs.id}/toggle/",
        f"/alerts/channels/{theirs.id}/test/",
        f"/alerts/channels/{theirs.id}/delete/",
        f"/alerts/rules/{their_rule.id}/toggle/",
        f"/alerts/rules/{their_rule.id}/delete/",
    ]:
        assert client.post(url).status_code == 404, url
    assert AlertChannel.objects.filter(id=theirs.id, enabled=True).exists()
    assert AlertRule.objects.filter(id=their_rule.id).exists() and not Alert.objects.exists()
    # Nor can a rule be pointed at another tenant's channel.
    response = client.post("/alerts/rules/", {"event": "occurrence_dead",
                                              "channel_id": str(theirs.id)})  # fmt: skip
    assert response.status_code == 400
    assert "channel_id" in response.context["rule_form"].errors
    assert AlertRule.objects.filter(channel=theirs).count() == 1


def test_test_alert_button_flashes_and_the_reaper_turns_it_into_a_delivery(client, alice, tenant_a):
    ch = channel(tenant_a, "ops@example.com")
    client.force_login(alice)

    response = client.post(f"/alerts/channels/{ch.id}/test/", follow=True)

    alert = Alert.objects.get(channel=ch)
    assert (alert.event, alert.delivery_id) == (AlertEvent.TEST, None)
    assert response.redirect_chain == [("/alerts/", 302)]
    text = response.content.decode()
    assert f"Test alert {alert.id} recorded" in text
    assert response.context["history"] == [(alert, "pending")]

    # The reaper's grouping makes it a message once the coalescing wait is over.
    later = timezone.now() + timedelta(seconds=11)
    assert group_pending(now=later, coalesce_s=10, interval_s=3600) == (1, 1)
    alert.refresh_from_db()
    delivery = AlertDelivery.objects.get(alerts=alert)
    assert (delivery.channel_id, delivery.alert_count) == (ch.id, 1)
    AlertDelivery.objects.filter(id=delivery.id).update(
        state=AlertDelivery.State.FAILED, sent_at=timezone.now(), last_error="550 no such user"
    )
    page = client.get("/alerts/")
    assert [(a.id, state) for a, state in page.context["history"]] == [(alert.id, "failed")]
    assert "550 no such user" in page.content.decode()
