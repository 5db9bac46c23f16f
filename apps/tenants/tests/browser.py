"""Headless Debian Chromium for the web UI's browser tests (docs/ui.md): the binaries, the
mark that skips without them, one way to start a driver, and a wait. The `browser` fixture
(conftest.py) is built on `chromium_driver`."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SHOTS = settings.BASE_DIR / "docs" / "screenshots"

NEEDS_CHROMIUM = pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
    reason="needs Debian's chromium and chromium-driver (make browsers)",
)


@contextmanager
def chromium_driver(*, console_log: bool = False) -> Iterator[Any]:
    """A headless Chromium on a throw-away profile; `console_log` keeps the browser console
    for `driver.get_log("browser")`."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="tick-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1280,1000",
    ):  # fmt: skip
        options.add_argument(flag)
    if console_log:
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait(driver: Any, condition: Any, timeout: float = 10) -> Any:
    """Until `condition` holds; an element htmx or a POST-redirect swapped out while it was read
    (stale, or "does not belong to the document" as Chromium sometimes words it) counts as not
    yet."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    def settled(current: Any) -> Any:
        try:
            return condition(current)
        except WebDriverException as exc:
            if "does not belong to the document" in str(exc):
                return False
            raise

    ignored = [StaleElementReferenceException]
    return WebDriverWait(driver, timeout, ignored_exceptions=ignored).until(settled)


def page_shot(driver: Any, name: str, *, width: int = 1280) -> None:
    """With TICK_SCREENSHOTS=1, the whole page as docs/screenshots/<name>.png (the window grows
    past the document: its frame takes some height)."""
    if os.environ.get("TICK_SCREENSHOTS") != "1":
        return
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.set_window_size(width, 1000)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(width, min(max(int(height) + 160, 500), 3000))
    driver.save_screenshot(str(SHOTS / f"{name}.png"))
    driver.set_window_size(1280, 1000)


def log_in(
    driver: Any, base: str, username: str, password: str, *, shot: str | None = None
) -> None:
    """Sign in on the tenant login page and land on the dashboard; `shot` screenshots the
    login page first."""
    from selenium.webdriver.common.by import By

    driver.get(f"{base}/login/")
    if shot:
        page_shot(driver, shot, width=420)
    driver.find_element(By.NAME, "username").send_keys(username)
    driver.find_element(By.NAME, "password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(driver, lambda d: d.current_url.rstrip("/") == base)
