"""The Webhook signing page in real headless Chromium (Debian's `chromium` + `chromium-driver`
through Selenium) against the live server: rotate twice, read the secret shown once, revoke the
previous one through the confirmation dialog. With TICK_SCREENSHOTS=1 the page is saved as
docs/screenshots/webhook-signing.png."""

from __future__ import annotations

import os
import time

import pytest
from django.conf import settings

from apps.tenants.models import SigningSecret
from apps.tenants.tests.browser import NEEDS_CHROMIUM
from apps.tenants.tests.browser import wait as _wait

pytestmark = [
    pytest.mark.django_db(transaction=True),
    NEEDS_CHROMIUM,
]


def test_rotate_read_once_and_revoke_in_a_real_browser(live_server, browser, alice, tenant_a):
    from selenium.webdriver.common.by import By

    driver = browser
    base = live_server.url
    driver.get(f"{base}/login/")
    driver.find_element(By.NAME, "username").send_keys("alice")
    driver.find_element(By.NAME, "password").send_keys("pw-alice-123")
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    _wait(driver, lambda d: d.current_url.rstrip("/") == base)

    # rotate twice: the second answer shows its secret once, and both secrets are listed
    driver.get(f"{base}/signing/")
    driver.find_element(By.ID, "rotate").click()
    _wait(driver, lambda d: d.find_elements(By.ID, "new-secret"))
    driver.find_element(By.ID, "rotate").click()
    _wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#secrets tbody tr")) == 2)
    shown = driver.find_element(By.ID, "new-secret").get_attribute("value")
    newest = SigningSecret.objects.filter(tenant=tenant_a).latest("created_at")
    assert shown.startswith(newest.prefix) and len(shown) == len("whsec_") + 44
    driver.find_element(By.CSS_SELECTOR, "[data-copy]").click()
    _wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, "[data-copy]").text == "Copied")
    if os.environ.get("TICK_SCREENSHOTS") == "1":
        driver.set_window_size(1100, 760)
        driver.save_screenshot(str(settings.BASE_DIR / "docs/screenshots/webhook-signing.png"))

    # revoke the previous secret: dismissing the dialog keeps it, accepting revokes it
    previous = SigningSecret.objects.filter(tenant=tenant_a).earliest("created_at")
    revoke = f"form[action='/signing/{previous.id}/revoke/'] button"
    driver.find_element(By.CSS_SELECTOR, revoke).click()
    _wait(driver, lambda d: d.switch_to.alert).dismiss()
    time.sleep(0.5)  # a submitted form would have reached the server by now
    assert driver.find_elements(By.ID, "new-secret")  # still the same page
    previous.refresh_from_db()
    assert previous.revoked_at is None
    driver.find_element(By.CSS_SELECTOR, revoke).click()
    _wait(driver, lambda d: d.switch_to.alert).accept()
    _wait(driver, lambda d: "revoked" in d.find_element(By.CSS_SELECTOR, ".messages").text)
    previous.refresh_from_db()
    assert previous.revoked_at is not None
    # the secret is gone from the page once it has been shown
    assert shown not in driver.page_source
