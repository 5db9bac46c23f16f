"""The Alerts page in real headless Chromium against the live server: a refused address shown
under its field, a channel and a rule added, a test alert sent with the button, grouped and
delivered by the reaper's and the worker's functions, and its state in the history. With
TICK_SCREENSHOTS=1 the page is saved as docs/screenshots/alerts.png."""

from __future__ import annotations

import functools
from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from apps.occurrences.alerts.deliver import ALERT_ID_HEADER, alert_deliver
from apps.occurrences.alerts.dispatch import group_pending
from apps.occurrences.models import Alert, AlertChannel, AlertDelivery, AlertEvent, AlertRule
from apps.schedules.tests.factories import make_schedule
from apps.tenants.tests.browser import NEEDS_CHROMIUM, log_in, page_shot, wait
from apps.tenants.tests.mails import link_in

# Pages behind POST-redirects take a while on a loaded machine.
_wait = functools.partial(wait, timeout=20)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    NEEDS_CHROMIUM,
]


def _fill(driver, form_id: str, values: dict[str, str]) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    form = driver.find_element(By.ID, form_id)
    for name, value in values.items():
        field = form.find_element(By.NAME, name)
        if field.tag_name == "select":
            Select(field).select_by_value(value)
        else:
            field.clear()
            field.send_keys(value)


def test_add_a_channel_and_a_rule_and_send_a_test_alert(live_server, browser, alice, tenant_a):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.expected_conditions import alert_is_present

    driver = browser
    base = live_server.url
    job = make_schedule(tenant_a, name="nightly export")
    log_in(driver, base, "alice", "pw-alice-123")
    driver.find_element(By.LINK_TEXT, "Alerts").click()
    _wait(driver, lambda d: d.find_elements(By.ID, "channel-form"))

    # A refused address stays in the form with the domain's message under its field.
    _fill(driver, "channel-form", {"name": "on-call", "kind": "email", "target": "on-call"})
    driver.find_element(By.ID, "add-channel").click()
    _wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-field=target] .error"))
    error = driver.find_element(By.CSS_SELECTOR, "[data-field=target] .error").text
    assert error == "Enter a valid e-mail address."
    assert not AlertChannel.objects.exists()

    _fill(driver, "channel-form", {"target": "on-call@example.com"})
    driver.find_element(By.ID, "add-channel").click()
    _wait(driver, lambda d: "Channel “on-call” added." in d.find_element(By.TAG_NAME, "main").text)
    channel = AlertChannel.objects.get(tenant=tenant_a)
    assert (channel.kind, channel.target) == ("email", "on-call@example.com")
    # Pending until the address follows the mailed link and presses "Confirm".
    assert "pending confirmation" in driver.find_element(By.ID, "channels").text
    link = link_in(mail.outbox[0].body, r"https?://[^/\s]+(/alerts/confirm/\S+/)")
    mail.outbox.clear()
    driver.get(f"{base}{link}")
    driver.find_element(By.ID, "confirm").click()
    _wait(driver, lambda d: "Alerts confirmed" in d.find_element(By.TAG_NAME, "main").text)
    driver.get(f"{base}/alerts/")

    _fill(driver, "rule-form", {
        "event": "start_lag", "channel_id": str(channel.id), "schedule_id": str(job.id),
        "threshold_s": "45", "window_minutes": "3",
    })  # fmt: skip
    driver.find_element(By.ID, "add-rule").click()
    _wait(driver, lambda d: "Rule added" in d.find_element(By.TAG_NAME, "main").text)
    rule = AlertRule.objects.get(tenant=tenant_a)
    assert (rule.event, rule.schedule_id, rule.threshold_s) == ("start_lag", job.id, 45)
    rules_text = driver.find_element(By.ID, "rules").text
    assert "nightly export" in rules_text and "p95 > 45 s for 3 min" in rules_text
    _fill(driver, "rule-form", {"event": "occurrence_dead", "channel_id": str(channel.id)})
    driver.find_element(By.ID, "add-rule").click()
    _wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#rules tr[data-rule]")) == 2)

    row = f"tr[data-channel='{channel.id}']"
    driver.find_element(By.CSS_SELECTOR, f"{row} button[name=test]").click()
    _wait(driver, lambda d: "Test alert" in d.find_element(By.CSS_SELECTOR, ".messages").text)
    alert = Alert.objects.get(channel=channel)
    assert alert.event == AlertEvent.TEST
    assert (
        f"Test alert {alert.id} recorded" in driver.find_element(By.CSS_SELECTOR, ".messages").text
    )
    history = driver.find_element(By.CSS_SELECTOR, f"tr[data-alert='{alert.id}']").text
    assert "pending" in history

    # What the reaper and a worker do with it: one message, sent with its id.
    later = timezone.now() + timedelta(seconds=11)  # after the coalescing wait
    assert group_pending(now=later, coalesce_s=10, interval_s=60) == (1, 1)
    delivery = AlertDelivery.objects.get(alerts=alert)
    assert alert_deliver(delivery.id) == AlertDelivery.State.SENT
    assert [m.extra_headers[ALERT_ID_HEADER] for m in mail.outbox] == [str(delivery.id)]
    driver.get(f"{base}/alerts/")
    history = driver.find_element(By.CSS_SELECTOR, f"tr[data-alert='{alert.id}']").text
    assert "sent" in history and "on-call" in history
    page_shot(driver, "alerts")

    # A delete asks first (data-confirm, tick.js): dismissed, nothing happens; accepted, gone.
    lag_row = f"tr[data-rule='{rule.id}']"
    driver.find_element(By.CSS_SELECTOR, f"{lag_row} button.danger").click()
    _wait(driver, alert_is_present()).dismiss()
    assert AlertRule.objects.filter(id=rule.id).exists()
    driver.find_element(By.CSS_SELECTOR, f"{lag_row} button.danger").click()
    _wait(driver, alert_is_present()).accept()
    _wait(driver, lambda d: "deleted" in d.find_element(By.CSS_SELECTOR, ".messages").text)
    assert not AlertRule.objects.filter(id=rule.id).exists()
