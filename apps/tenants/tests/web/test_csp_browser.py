"""The Content-Security-Policy in real headless Chromium (docs/security.md "CSP and headers"):
every main tenant page, the admin pages support staff use, and the API docs render and work
with no CSP violation in the browser console, and the header is on each response."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.occurrences.models import Occurrence
from apps.occurrences.tests.support.rows import occurrence, schedule
from apps.tenants.models import Tenant
from apps.tenants.tests.browser import NEEDS_CHROMIUM, chromium_driver
from apps.tenants.tests.browser import wait as _wait

pytestmark = [
    pytest.mark.django_db(transaction=True),
    NEEDS_CHROMIUM,
]

# Recorded from the first script of every document, before any page script runs.
RECORDER = """
window.__cspViolations = [];
document.addEventListener('securitypolicyviolation', function (e) {
  window.__cspViolations.push(e.violatedDirective + ' ' + (e.blockedURI || 'inline') + ' '
                              + (e.sourceFile || '') + ':' + e.lineNumber);
});
"""


@pytest.fixture
def browser() -> Iterator[Any]:
    """Chromium with its console kept, and the CSP violation recorder in every page."""
    with chromium_driver(console_log=True) as driver:
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RECORDER})
        yield driver


def _violations(driver: Any) -> list[str]:
    """CSP violations of the current page: the listener's events and Chromium's console
    'Refused to …' lines (the console log is drained by each read)."""
    events = driver.execute_script("return window.__cspViolations || []")
    console = [
        entry["message"]
        for entry in driver.get_log("browser")
        if "Content Security Policy" in entry["message"] or "Refused to" in entry["message"]
    ]
    return [*events, *console]


def _visit(driver: Any, url: str, ready: Any = None) -> list[str]:
    driver.get(url)
    _wait(driver, lambda d: d.execute_script("return document.readyState") == "complete")
    if ready is not None:
        _wait(driver, ready)
    return _violations(driver)


def _login(driver: Any, base: str, path: str, username: str, password: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{base}{path}")
    driver.find_element(By.NAME, "username").send_keys(username)
    driver.find_element(By.NAME, "password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "[type=submit]").click()
    _wait(driver, lambda d: "login" not in d.current_url)


def test_the_recorder_sees_a_violation(live_server: Any, browser: Any, alice: Any) -> None:
    # given a page under the policy
    assert _visit(browser, f"{live_server.url}/login/") == []

    # when a script adds an inline style block
    browser.execute_script(
        "var s = document.createElement('style'); s.textContent = 'body{color:red}';"
        "document.head.appendChild(s);"
    )

    # then the policy refuses it and the check reports it
    _wait(browser, lambda d: d.execute_script("return window.__cspViolations.length") > 0)
    assert any("style-src" in line for line in _violations(browser))


def test_tenant_pages_work_under_the_csp(live_server: Any, browser: Any, alice: Any,
                                         tenant_a: Tenant) -> None:  # fmt: skip
    from selenium.webdriver.common.by import By

    base = live_server.url
    sched = schedule(tenant_a, name="nightly")
    now = timezone.now()
    dead = occurrence(sched, now - timedelta(minutes=3), state="DEAD")
    done = occurrence(sched, now - timedelta(minutes=6), state="SUCCEEDED")
    Occurrence.objects.filter(id=done.id).update(
        lane="strict", enqueued_at=done.scheduled_for + timedelta(seconds=1), finished_at=now
    )
    assert _visit(browser, f"{base}/login/") == []
    _login(browser, base, "/login/", "alice", "pw-alice-123")

    pages = {
        "/": lambda d: d.execute_script("return typeof Chart !== 'undefined'"),
        "/schedules/": None,
        f"/schedules/{sched.id}/": None,
        "/occurrences/?from=2000-01-01T00:00": None,
        f"/occurrences/{dead.id}/": None,
        "/dlq/": None,
        "/keys/": None,
        "/members/": None,
    }
    for path, ready in pages.items():
        assert _visit(browser, f"{base}{path}", ready) == [], path

    # the live preview (htmx) still swaps its fragment in
    assert _visit(browser, f"{base}/schedules/new/") == []
    browser.find_element(By.NAME, "expression").send_keys("0 9 * * *")
    _wait(browser, lambda d: "09:00" in d.find_element(By.ID, "preview-body").text)
    # the DLQ's select-all box (was an inline onclick) ticks every row
    browser.get(f"{base}/dlq/")
    browser.find_element(By.CSS_SELECTOR, "input[data-select-all]").click()
    boxes = browser.find_elements(By.CSS_SELECTOR, "input[name=ids]")
    assert boxes and all(box.is_selected() for box in boxes)
    # a new key is shown once, selected on click (was an inline onclick)
    browser.get(f"{base}/keys/")
    browser.find_element(By.NAME, "name").send_keys("ci")
    browser.find_element(By.CSS_SELECTOR, "button.primary").click()
    key = _wait(browser, lambda d: d.find_elements(By.ID, "new-key"))[0]
    key.click()
    selected = browser.execute_script("return window.getSelection().toString() || "
                                      "(document.activeElement.selectionEnd - "
                                      "document.activeElement.selectionStart)")  # fmt: skip
    assert selected not in ("", 0)
    # revoking asks first (was an inline onsubmit): dismissing keeps the key
    browser.find_element(By.CSS_SELECTOR, "form[data-confirm] button").click()
    _wait(browser, lambda d: d.switch_to.alert).dismiss()
    assert tenant_a.api_keys.filter(revoked_at__isnull=True).count() == 1
    browser.find_element(By.CSS_SELECTOR, "form[data-confirm] button").click()
    _wait(browser, lambda d: d.switch_to.alert).accept()
    _wait(browser, lambda d: "revoked" in d.page_source)
    assert tenant_a.api_keys.filter(revoked_at__isnull=True).count() == 0
    assert _violations(browser) == []


def test_admin_and_api_docs_work_under_the_csp(live_server: Any, browser: Any, tenant_a: Tenant,
                                               django_user_model: Any) -> None:  # fmt: skip
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    django_user_model.objects.create_superuser("root", password="pw-root-123")
    sched = schedule(tenant_a, name="support case")
    base = live_server.url
    _login(browser, base, "/admin/login/", "root", "pw-root-123")

    for path in (
        "/admin/",
        "/admin/schedules/schedule/",
        f"/admin/schedules/schedule/{sched.id}/change/",
        f"/admin/tenants/tenant/{tenant_a.id}/change/",
        "/admin/tenants/apikey/",
        "/admin/tenants/tenantevent/",
        "/admin/occurrences/browse/",
        "/admin/auth/user/add/",
    ):
        assert _visit(browser, f"{base}{path}") == [], path

    # an admin action still runs (the action bar's script is static)
    browser.get(f"{base}/admin/schedules/schedule/")
    browser.find_element(By.CSS_SELECTOR, "input.action-select").click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("pause")
    browser.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    _wait(browser, lambda d: "Paused 1 schedule" in d.page_source)
    sched.refresh_from_db()
    assert sched.state == "PAUSED"
    assert _violations(browser) == []

    # Swagger UI renders the schema
    assert _visit(browser, f"{base}/api/docs/",
                  lambda d: d.find_elements(By.CSS_SELECTOR, ".opblock")) == []  # fmt: skip
