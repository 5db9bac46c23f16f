"""The web UI in real headless Chromium (Debian's `chromium` + `chromium-driver`, driven by
Selenium) against pytest-django's live server: log in, create a cron schedule while the live
preview follows the expression, pause it and read the receipt, replay a DEAD occurrence from
the DLQ page. With TICK_SCREENSHOTS=1 the main pages are saved under docs/screenshots/."""

from __future__ import annotations

import functools
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.occurrences.models import Attempt, Occurrence
from apps.occurrences.tests.support.rows import occurrence, schedule, state_of
from apps.schedules.models import Schedule
from apps.tenants.tests.browser import NEEDS_CHROMIUM, log_in
from apps.tenants.tests.browser import page_shot as _shot
from apps.tenants.tests.browser import wait as _wait

_login = functools.partial(log_in, shot="login")

pytestmark = [
    pytest.mark.django_db(transaction=True),
    NEEDS_CHROMIUM,
]


def _first_preview_row(driver) -> str:
    from selenium.webdriver.common.by import By

    rows = driver.find_elements(By.CSS_SELECTOR, "#preview-body table.preview tbody tr")
    return str(rows[0].text) if rows else ""


def _seed_lag(tenant) -> None:
    """Enqueued occurrences over the last two hours, strict and flexible, with some lag."""
    now = timezone.now().replace(microsecond=0)
    for i in range(48):
        for lane, base_lag in (("strict", 0.3), ("flexible", 0.8)):
            at = now - timedelta(minutes=2 + 2.5 * i)
            occ = occurrence(schedule(tenant, name=f"{lane} job"), at, state="SUCCEEDED")
            lag = base_lag + (i % 7) * 0.25 + (2.5 if i % 11 == 0 else 0)
            Occurrence.objects.filter(id=occ.id).update(
                lane=lane, enqueued_at=at + timedelta(seconds=lag), finished_at=at
            )


def test_create_preview_pause_and_replay_in_a_real_browser(live_server, browser, alice, tenant_a):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    driver = browser
    base = live_server.url
    _login(driver, base, "alice", "pw-alice-123")

    # create: the preview follows the expression as it is typed
    driver.get(f"{base}/schedules/new/")
    driver.find_element(By.NAME, "name").send_keys("morning digest")
    expression = driver.find_element(By.NAME, "expression")
    expression.send_keys("0 9 * * *")
    _wait(driver, lambda d: "09:00" in _first_preview_row(d))
    zone = driver.find_element(By.NAME, "time_zone")
    zone.send_keys(Keys.CONTROL, "a")
    zone.send_keys("America/New_York")
    _wait(driver, lambda d: "EST" in _first_preview_row(d) or "EDT" in _first_preview_row(d))
    expression.send_keys(Keys.CONTROL, "a")
    expression.send_keys("30 2 * * *")
    _wait(driver, lambda d: "02:30" in _first_preview_row(d))
    expression.send_keys(Keys.CONTROL, "a")
    expression.send_keys("0 0 30 2 *")
    _wait(driver, lambda d: "never" in d.find_element(By.ID, "preview-body").text)
    expression.send_keys(Keys.CONTROL, "a")
    expression.send_keys("*/15 8-18 * * 1-5")
    _wait(driver, lambda d: _first_preview_row(d) != "")
    Select(driver.find_element(By.NAME, "handler")).select_by_value("record")
    _shot(driver, "schedule-form-live-preview")
    driver.find_element(By.ID, "save").click()
    _wait(driver, lambda d: "/schedules/" in d.current_url and d.find_elements(By.ID, "pause"))
    created = Schedule.objects.get(tenant=tenant_a)
    assert (created.expression, created.time_zone) == ("*/15 8-18 * * 1-5", "America/New_York")

    # pause: the receipt is shown
    driver.find_element(By.ID, "pause").click()
    receipt = _wait(driver, lambda d: d.find_elements(By.ID, "receipt"))[0]
    assert "Receipt: paused" in receipt.text
    assert "Paused" in driver.find_element(By.ID, "schedule-state").text
    _shot(driver, "schedule-detail-receipt")
    created.refresh_from_db()
    assert created.state == "PAUSED"

    # the DLQ: replay one DEAD occurrence
    dead = occurrence(schedule(tenant_a, name="flaky webhook"),
                      timezone.now() - timedelta(minutes=3), state="DEAD")  # fmt: skip
    Occurrence.objects.filter(id=dead.id).update(attempt_count=5, finished_at=timezone.now())
    Attempt.objects.create(
        scheduled_for=dead.scheduled_for, occurrence_id=dead.id, tenant_id=tenant_a.id,
        attempt_no=5, lease_token=uuid.uuid4(), lease_expires_at=timezone.now(),
        worker_id="worker-1", started_at=timezone.now(), finished_at=timezone.now(),
        outcome="FAILED", error_class="WebhookError", error_message="HTTP 503 after 5 attempts",
    )  # fmt: skip
    driver.get(f"{base}/dlq/")
    assert "HTTP 503 after 5 attempts" in driver.page_source
    _shot(driver, "dlq")
    driver.find_element(By.CSS_SELECTOR, "button.replay-one").click()
    result = _wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".messages li"))[0]
    assert result.text.startswith("Replayed 1 occurrence:")
    assert driver.current_url == f"{base}/dlq/"  # redirected after the POST
    assert state_of(dead) == "RETRY_WAIT"
    _shot(driver, "dlq-replayed")

    # the dashboard charts lag percentiles with the vendored Chart.js
    _seed_lag(tenant_a)
    driver.get(f"{base}/")
    _wait(driver, lambda d: d.execute_script(
        "return typeof Chart !== 'undefined' && !!Chart.getChart('lag-strict')"
    ))  # fmt: skip
    for name, path in (("dashboard", "/"), ("schedules", "/schedules/"),
                       ("occurrences", "/occurrences/?from=2000-01-01T00:00")):  # fmt: skip
        driver.get(f"{base}{path}")
        _shot(driver, name)
    driver.get(f"{base}/schedules/{created.id}/")
    _shot(driver, "schedule-detail-phone", width=390)


def test_viewer_sees_no_controls_in_the_browser(live_server, browser, bob, tenant_a):
    from selenium.webdriver.common.by import By

    sched = schedule(tenant_a, name="read only")
    _login(browser, live_server.url, "bob", "pw-bob-123")

    browser.get(f"{live_server.url}/schedules/{sched.id}/")

    assert browser.find_elements(By.ID, "pause") == []
    assert "viewer" in browser.find_element(By.CSS_SELECTOR, ".role").text
