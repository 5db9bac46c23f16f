"""Invite → accept → sign in, in real headless Chromium (Debian's `chromium` +
`chromium-driver`, Selenium) against the live server. With TICK_SCREENSHOTS=1 the members
page and the invitation accept page are saved under docs/screenshots/."""

from __future__ import annotations

import pytest
from django.core import mail

from apps.tenants.members import invitation_create
from apps.tenants.models import Membership
from apps.tenants.tests.browser import NEEDS_CHROMIUM
from apps.tenants.tests.browser import log_in as _login
from apps.tenants.tests.browser import page_shot as _shot
from apps.tenants.tests.browser import wait as _wait
from apps.tenants.tests.mails import link_in

pytestmark = [
    pytest.mark.django_db(transaction=True),
    NEEDS_CHROMIUM,
]


def _log_out(driver) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.CSS_SELECTOR, ".who button.link").click()
    _wait(driver, lambda d: "/login/" in d.current_url)


def test_invite_accept_and_sign_in_in_a_real_browser(live_server, browser, alice, bob, tenant_a):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = browser
    base = live_server.url
    invitation_create(
        tenant=tenant_a, email="ops-oncall@example.com", role=Membership.Role.ADMIN,
        actor="user:alice", site_url=base,
    )  # fmt: skip
    _login(driver, base, "alice", "pw-alice-123")

    # the admin invites a viewer from the members page
    driver.get(f"{base}/members/")
    driver.find_element(By.ID, "invite-email").send_keys("carol@example.com")
    Select(driver.find_element(By.ID, "invite-role")).select_by_value("viewer")
    driver.find_element(By.ID, "invite-send").click()
    _wait(driver, lambda d: "Invitation sent to carol@example.com" in d.page_source)
    assert "carol@example.com" in driver.find_element(By.ID, "invitations").text
    _shot(driver, "members")

    # the invited person opens the mailed link, signed out, and chooses a password
    link = link_in(mail.outbox[-1].body, r"http://\S+/invite/\S+/", group=0)
    assert mail.outbox[-1].to == ["carol@example.com"]
    _log_out(driver)
    driver.get(link)
    assert "Join Alpha" in driver.find_element(By.TAG_NAME, "h1").text
    _shot(driver, "invitation-accept", width=480)
    driver.find_element(By.NAME, "password1").send_keys("Carol-pw-9931")
    driver.find_element(By.NAME, "password2").send_keys("Carol-pw-9931")
    driver.find_element(By.ID, "accept-create").click()
    _wait(driver, lambda d: d.current_url.rstrip("/") == base)
    assert "Welcome to Alpha" in driver.page_source
    assert driver.find_element(By.CSS_SELECTOR, ".who .role").text == "viewer"

    # and signs in again later with the e-mail as username: a viewer sees no invite form
    _log_out(driver)
    _login(driver, base, "carol@example.com", "Carol-pw-9931")
    driver.get(f"{base}/members/")
    assert not driver.find_elements(By.ID, "invite-email")
    members = driver.find_element(By.ID, "members").text
    assert "carol@example.com" in members and "alice" in members
    # the used link is refused now
    driver.get(link)
    assert "already used" in driver.page_source
