"""The dashboard's empty and full states in real headless Chromium (docs/ui.md "Dashboard").
With TICK_SCREENSHOTS=1 they are saved as docs/screenshots/dashboard-empty.png and
dashboard-full.png."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.occurrences.models import Occurrence
from apps.occurrences.schedules.tests.web.test_browser import _login
from apps.occurrences.tests.support.rows import attempt_started, dead_occurrence, occurrence
from apps.occurrences.tests.support.rows import schedule as make
from apps.tenants.tests.browser import NEEDS_CHROMIUM, SHOTS

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("partitions_around_today"),
    NEEDS_CHROMIUM,
]


def _shot(driver, name: str) -> None:
    if os.environ.get("TICK_SCREENSHOTS") == "1":
        SHOTS.mkdir(parents=True, exist_ok=True)
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(1280, height)
        driver.save_screenshot(str(SHOTS / f"{name}.png"))


def test_the_dashboard_empty_then_full(live_server, browser, alice, tenant_a):  # noqa: F811
    from selenium.webdriver.common.by import By

    driver = browser
    driver.set_window_size(1280, 900)
    # active, its first run still ahead and never within the backlog's 10 minutes: a test
    # must not depend on the hour it runs at
    demo = make(tenant_a, name="demo", expression="0 0 29 2 *")
    _login(driver, live_server.url, "alice", "pw-alice-123")

    # the empty state: a schedule, no run yet — when it is due, not "create a schedule"
    driver.get(f"{live_server.url}/")
    main = driver.find_element(By.TAG_NAME, "main").text
    assert "No run in the last day yet: 1 active schedule, the next run is due" in main
    assert "Create a schedule" not in main
    assert "Nothing overdue and nothing due in the next 10 minutes." in main
    _shot(driver, "dashboard-empty")

    # the full state: runs that succeeded and failed, one overdue and not yet enqueued
    now = timezone.now()
    for minutes in (50, 40, 30, 20):
        ran = occurrence(demo, now - timedelta(minutes=minutes), state=Occurrence.State.SUCCEEDED)
        attempt_started(ran, ran.scheduled_for + timedelta(seconds=1))
    dead_occurrence(tenant_a, minutes_ago=15)
    occurrence(demo, now - timedelta(minutes=2), state=Occurrence.State.SCHEDULED)
    driver.set_window_size(1280, 900)
    driver.get(f"{live_server.url}/")

    backlog = driver.find_element(By.ID, "backlog").text
    # the run left SCHEDULED 2 minutes ago (the DLQ's hourly schedule may also be due soon)
    overdue = [line for line in backlog.splitlines() if " overdue " in line]
    assert len(overdue) == 1 and overdue[0].endswith("overdue 1 0")
    main = driver.find_element(By.TAG_NAME, "main").text
    assert "No run in the last day yet" not in main and "Create a schedule" not in main
    _shot(driver, "dashboard-full")
