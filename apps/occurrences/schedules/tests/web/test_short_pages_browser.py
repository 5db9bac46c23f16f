"""A schedule with a long failing history in real headless Chromium: the page stays short
(counts and the last error per occurrence, 10 rows a list) and "Show more" lists the rest.
With TICK_SCREENSHOTS=1 the page is saved as docs/screenshots/schedule-long-failing-history.png."""

from __future__ import annotations

import os

import pytest

from apps.occurrences.schedules.tests.web.long_history import failing_schedule
from apps.occurrences.schedules.tests.web.test_browser import _login
from apps.tenants.tests.browser import NEEDS_CHROMIUM, SHOTS
from apps.tenants.tests.browser import wait as _wait

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("partitions_around_today"),
    NEEDS_CHROMIUM,
]


def test_a_long_failing_history_keeps_the_page_short(live_server, browser, alice, tenant_a):  # noqa: F811
    from selenium.webdriver.common.by import By

    sched, latest = failing_schedule(tenant_a)
    driver = browser
    _login(driver, live_server.url, "alice", "pw-alice-123")
    driver.set_window_size(1280, 900)
    driver.get(f"{live_server.url}/schedules/{sched.id}/")

    height = driver.execute_script("return document.documentElement.scrollHeight")
    row = driver.find_element(By.CSS_SELECTOR, f'tr[data-occurrence="{latest.id}"]')
    assert "15 attempts" in row.text and "ConnectError — try 15:" in row.text
    assert height < 2400, height  # 25 occurrences and their 39 attempts inline made ~4,000
    if os.environ.get("TICK_SCREENSHOTS") == "1":
        SHOTS.mkdir(parents=True, exist_ok=True)
        driver.set_window_size(1280, height)
        driver.save_screenshot(str(SHOTS / "schedule-long-failing-history.png"))

    driver.find_element(By.CSS_SELECTOR, '[data-more="recent"] a').click()
    _wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#recent tbody tr")) == 25)
    assert driver.find_elements(By.CSS_SELECTOR, '[data-more="recent"] a')
