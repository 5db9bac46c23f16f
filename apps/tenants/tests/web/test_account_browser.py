"""The account page in real headless Chromium: the header keeps the navigation and the tenant
switcher, and this session is named by browser and system. With TICK_SCREENSHOTS=1 it is
saved as docs/screenshots/account.png."""

from __future__ import annotations

import os

import pytest

from apps.occurrences.schedules.tests.web.test_browser import _login
from apps.tenants.tests.browser import NEEDS_CHROMIUM, SHOTS

pytestmark = [pytest.mark.django_db(transaction=True), NEEDS_CHROMIUM]


def test_the_account_page_keeps_the_header_and_names_the_device(live_server, browser, alice):  # noqa: F811
    from selenium.webdriver.common.by import By

    driver = browser
    driver.set_window_size(1280, 800)
    _login(driver, live_server.url, "alice", "pw-alice-123")

    driver.get(f"{live_server.url}/account/")

    nav = driver.find_element(By.CSS_SELECTOR, "nav.nav").text
    assert "Schedules" in nav and "Members" in nav
    assert driver.find_elements(By.CSS_SELECTOR, "#tenant-switch")
    session = driver.find_element(By.CSS_SELECTOR, "#sessions tbody tr td").text
    assert session.startswith("Headless Chrome on Linux") and "this session" in session
    if os.environ.get("TICK_SCREENSHOTS") == "1":
        SHOTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(SHOTS / "account.png"))
