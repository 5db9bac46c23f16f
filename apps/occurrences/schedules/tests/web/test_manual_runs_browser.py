"""Run now and the backfill dialog in real headless Chromium: click Run now and read the
receipt, open the dialog, preview a range (count, first and last), confirm, and see the
same range preview nothing afterwards. With TICK_SCREENSHOTS=1 the button and the dialog are
saved under docs/screenshots/ (element crops: small PNGs)."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from apps.occurrences.models import Occurrence
from apps.occurrences.schedules.tests.web.test_browser import _login
from apps.occurrences.tests.support import rows
from apps.tenants.tests.browser import NEEDS_CHROMIUM, SHOTS
from apps.tenants.tests.browser import wait as _wait

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("partitions_around_today"),
    NEEDS_CHROMIUM,
]


def _hour(hours_ago: int) -> datetime:
    top = timezone.now().astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return top - timedelta(hours=hours_ago)


def _crop(element, name: str) -> None:
    if os.environ.get("TICK_SCREENSHOTS") == "1":
        SHOTS.mkdir(parents=True, exist_ok=True)
        element.screenshot(str(SHOTS / f"{name}.png"))


def _set_range(driver, start: datetime, end: datetime) -> None:
    # Set both values at once and fire the change event the dialog's preview listens to
    # (typing fires one preview per key).
    driver.execute_script(
        "document.getElementById('backfill-from').value = arguments[0];"
        "document.getElementById('backfill-to').value = arguments[1];"
        "document.getElementById('backfill-only')"
        ".dispatchEvent(new Event('change', {bubbles: true}));",
        start.strftime("%Y-%m-%d %H:%M"),
        end.strftime("%Y-%m-%d %H:%M"),
    )


def _preview_text(driver) -> str:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.ID, "backfill-summary")
    try:
        return str(found[0].text) if found else ""
    except StaleElementReferenceException:  # htmx is swapping the preview in: not yet
        return ""


def test_run_now_and_backfill_dialog_in_a_real_browser(live_server, browser, alice, tenant_a):  # noqa: F811
    from selenium.webdriver.common.by import By

    # given: an hourly schedule whose runs 4 h and 2 h ago were missed and 3 h ago succeeded
    schedule = rows.schedule(tenant_a, name="hourly export")
    rows.occurrence(schedule, _hour(4), state=Occurrence.State.MISSED)
    rows.occurrence(schedule, _hour(3), state=Occurrence.State.SUCCEEDED)
    rows.occurrence(schedule, _hour(2), state=Occurrence.State.MISSED)
    driver = browser
    base = live_server.url
    _login(driver, base, "alice", "pw-alice-123")
    driver.get(f"{base}/schedules/{schedule.id}/")
    _crop(driver.find_element(By.CSS_SELECTOR, ".head"), "schedule-run-now-button")

    # when: Run now is clicked
    driver.find_element(By.ID, "run-now").click()

    # then: the receipt names the occurrence, SCHEDULED on the strict lane; it is manual
    receipt = _wait(driver, lambda d: d.find_elements(By.ID, "run-receipt"))[0]
    assert "SCHEDULED" in receipt.text and "strict lane" in receipt.text
    manual = Occurrence.objects.get(schedule=schedule, origin=Occurrence.Origin.MANUAL)
    assert manual.requested_by == "user:alice" and str(manual.id) in receipt.text
    assert "Run now · user:alice" in driver.find_element(By.TAG_NAME, "main").text

    # when: the backfill dialog previews the last five hours
    driver.find_element(By.ID, "backfill-open").click()
    dialog = _wait(driver, lambda d: [e for e in d.find_elements(By.ID, "backfill-dialog")
                                      if e.get_attribute("open") is not None])[0]  # fmt: skip
    _set_range(driver, _hour(5), _hour(0))
    first, last = _hour(5).strftime("%Y-%m-%d %H:%M:%S"), _hour(1).strftime("%Y-%m-%d %H:%M:%S")
    _wait(driver, lambda d: "4 instants will run" in _preview_text(d))

    # then: count, first and last before anything is written
    summary = _preview_text(driver)
    assert first in summary and last in summary and "1 skipped (succeeded)" in summary
    assert not Occurrence.objects.filter(schedule=schedule, origin="backfill").exists()
    _crop(dialog, "schedule-backfill-dialog")

    # when: confirmed
    driver.find_element(By.ID, "backfill-confirm").click()

    # then: the receipt counts 4 queued, and those are the four instants
    receipt = _wait(driver, lambda d: d.find_elements(By.ID, "backfill-receipt"))[0]
    assert driver.find_element(By.ID, "backfill-queued").text == "4"
    backfilled = Occurrence.objects.filter(schedule=schedule, origin="backfill")
    assert sorted(o.scheduled_for for o in backfilled) == [_hour(h) for h in (5, 4, 2, 1)]
    assert "catchup lane" in receipt.text

    # and: the same range previews nothing more to run
    driver.find_element(By.ID, "backfill-open").click()
    _set_range(driver, _hour(5), _hour(0))
    _wait(driver, lambda d: "0 instants will run" in _preview_text(d))
    assert "4 already backfilled" in _preview_text(driver)
    assert driver.find_elements(By.ID, "backfill-confirm") == []


def test_the_backfill_dialog_opens_on_a_range_it_accepts(live_server, browser, alice, tenant_a):  # noqa: F811
    import re

    from selenium.webdriver.common.by import By

    # given: an every-minute rule, whose last 24 h hold more instants than one backfill runs
    schedule = rows.schedule(tenant_a, name="every minute", expression="* * * * *")
    driver = browser
    _login(driver, live_server.url, "alice", "pw-alice-123")
    driver.get(f"{live_server.url}/schedules/{schedule.id}/")

    # when: the dialog is opened (it previews its default range by itself)
    driver.find_element(By.ID, "backfill-open").click()
    _wait(
        driver,
        lambda d: "will run" in _preview_text(d) or d.find_elements(By.ID, "backfill-errors"),
    )

    # then: no error, a preview of the last hour, the fields in 24-hour UTC as labelled
    assert driver.find_elements(By.ID, "backfill-errors") == []
    assert "of 60 in the range" in _preview_text(driver)
    values = [driver.find_element(By.ID, f"backfill-{end}").get_attribute("value")
              for end in ("from", "to")]  # fmt: skip
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", v or "") for v in values), values
    _crop(driver.find_element(By.ID, "backfill-dialog"), "schedule-backfill-dialog-default")
