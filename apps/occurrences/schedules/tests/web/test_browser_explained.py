"""The schedule form and list explaining themselves, in real headless Chromium (see
test_browser.py): fields switch by kind without inline script, the rule in words follows the
expression as it is typed, the DST warning of the coming year follows the zone and policy,
and the list shows each schedule's health. TICK_SCREENSHOTS=1 saves the pages."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from apps.occurrences.execution.claim import occurrence_claim
from apps.occurrences.execution.complete import attempt_complete
from apps.occurrences.execution.handlers import PermanentError
from apps.occurrences.models import Occurrence
from apps.occurrences.schedules.tests.web import test_browser as base_browser
from apps.occurrences.tests.support.rows import occurrence, schedule
from apps.schedules.models import Schedule
from apps.tenants.tests.browser import page_shot as _shot
from apps.tenants.tests.browser import wait as _wait

pytestmark = base_browser.pytestmark
_login = base_browser._login


def _shown(driver, field: str) -> bool:
    from selenium.webdriver.common.by import By

    return bool(driver.find_element(By.CSS_SELECTOR, f'[data-field="{field}"]').is_displayed())


def _words(driver) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.ID, "expression-words").text)


def _warning(driver) -> str:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        found = driver.find_elements(By.ID, "dst-warning")
        return str(found[0].text) if found else ""
    except StaleElementReferenceException:  # htmx swapped the preview in between: read again
        return ""


def test_form_switches_by_kind_and_explains_the_rule_as_it_is_typed(
    live_server, browser, alice, tenant_a
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    driver = browser
    _login(driver, live_server.url, "alice", "pw-alice-123")
    driver.get(f"{live_server.url}/schedules/new/")

    # kind: a cron rule shows its expression, a one-shot its "Run at"
    assert _shown(driver, "expression") and not _shown(driver, "run_at")
    kind = Select(driver.find_element(By.NAME, "kind"))
    kind.select_by_value("one_shot")
    assert _shown(driver, "run_at") and not _shown(driver, "expression")
    kind.select_by_value("cron")
    assert _shown(driver, "expression") and not _shown(driver, "run_at")
    # the advanced options wait behind their disclosure
    assert not _shown(driver, "dst_gap")

    # the rule in words follows the typing
    expression = driver.find_element(By.NAME, "expression")
    expression.send_keys("0 9 * * 1-5")
    _wait(driver, lambda d: _words(d) == "At 09:00, Monday through Friday")
    expression.send_keys(Keys.CONTROL, "a")
    expression.send_keys("*/15 * * * *")
    _wait(driver, lambda d: _words(d) == "Every 15 minutes")
    expression.send_keys(Keys.CONTROL, "a")
    expression.send_keys("0 0 30 2 *")
    _wait(driver, lambda d: "never fires" in _words(d))

    # the DST warning of the coming year, for the zone and the gap policy
    expression.send_keys(Keys.CONTROL, "a")
    expression.send_keys("30 2 * * *")
    zone = driver.find_element(By.NAME, "time_zone")
    zone.send_keys(Keys.CONTROL, "a")
    zone.send_keys("America/New_York")
    _wait(driver, lambda d: "02:30 does not exist on" in _warning(d))
    assert _warning(driver).endswith("— skipped")
    assert "America/New_York" in _warning(driver)
    assert _words(driver) == "At 02:30"
    driver.find_element(By.CSS_SELECTOR, "details.advanced > summary").click()
    assert _shown(driver, "dst_gap") and not _shown(driver, "flexible_window_s")
    Select(driver.find_element(By.NAME, "dst_gap")).select_by_value("shift")
    _wait(driver, lambda d: "runs once at 03:00 local" in _warning(d))
    driver.find_element(By.NAME, "name").send_keys("nightly export")
    _shot(driver, "schedule-form-advanced-dst")


def test_form_shows_a_fixed_rate_in_words_with_its_runs_across_dst(
    live_server, browser, alice, tenant_a
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    driver = browser
    _login(driver, live_server.url, "alice", "pw-alice-123")
    driver.get(f"{live_server.url}/schedules/new/")
    assert not _shown(driver, "interval_every")
    Select(driver.find_element(By.NAME, "kind")).select_by_value("interval")
    assert _shown(driver, "interval_every") and _shown(driver, "interval_unit")
    assert not _shown(driver, "expression") and not _shown(driver, "run_at")

    every = driver.find_element(By.NAME, "interval_every")
    every.send_keys("90")
    zone = driver.find_element(By.NAME, "time_zone")
    zone.send_keys(Keys.CONTROL, "a")
    zone.send_keys("Europe/Berlin")
    driver.find_element(By.CSS_SELECTOR, "details.advanced > summary").click()
    # Anchored on the night Berlin falls back (01:00 UTC, 2027-10-31).
    driver.find_element(By.NAME, "start_at").send_keys("2027-10-30T22:00:00Z")

    def _interval_words(d) -> str:
        found = d.find_elements(By.ID, "interval-words")
        try:
            return str(found[0].text) if found else ""
        except Exception:  # noqa: BLE001 — swapped by htmx meanwhile: read again
            return ""

    _wait(driver, lambda d: "Every 90 minutes from 2027-10-30 22:00 UTC" in _interval_words(d))
    _wait(driver, lambda d: "still 90 minutes after it in elapsed time" in d.page_source)
    driver.find_element(By.NAME, "name").send_keys("sync every 90 minutes")
    _shot(driver, "schedule-form-fixed-rate")


def _ran(sched, due, *, fail: bool = False, lag_s: int = 1) -> None:
    occ = occurrence(sched, due, state=Occurrence.State.ENQUEUED)
    claim = occurrence_claim(occurrence_id=occ.id, scheduled_for=due, worker_id="worker-1",
                             now=due + timedelta(seconds=lag_s))  # fmt: skip
    attempt_complete(claim=claim, error=PermanentError("HTTP 410") if fail else None,
                     now=due + timedelta(seconds=lag_s + 1))  # fmt: skip


def test_list_shows_health_and_filters_the_failing(live_server, browser, alice, tenant_a):
    from selenium.webdriver.common.by import By

    now = timezone.now().replace(second=0, microsecond=0)
    report = schedule(tenant_a, name="hourly report", time_zone="Europe/Berlin")
    for i in range(6):
        _ran(report, now - timedelta(hours=6 - i, minutes=now.minute))
    webhook = schedule(tenant_a, name="partner webhook", expression="*/10 * * * 1-5")
    for i in range(5):
        _ran(webhook, now - timedelta(minutes=10 * (5 - i)), fail=i >= 3)
    slow = schedule(tenant_a, name="slow start", expression="*/5 * * * *")
    _ran(slow, now - timedelta(minutes=5), lag_s=95)
    new_year = now.replace(month=12, day=31, hour=23, minute=0) + timedelta(days=1)
    schedule(tenant_a, name="new year", kind=Schedule.Kind.ONE_SHOT, expression="", run_at=new_year)
    _login(browser, live_server.url, "alice", "pw-alice-123")

    browser.get(f"{live_server.url}/schedules/")
    rows = {r.find_element(By.CSS_SELECTOR, "td a").text: r.text
            for r in browser.find_elements(By.CSS_SELECTOR, "tr[data-schedule]")}  # fmt: skip
    assert "Succeeded" in rows["hourly report"] and "100% of 6" in rows["hourly report"]
    assert "failing" in rows["partner webhook"] and "60% of 5" in rows["partner webhook"]
    assert "late" in rows["slow start"]
    assert "Once at" in rows["new year"]
    _shot(browser, "schedules-health")

    browser.get(f"{live_server.url}/schedules/?health=failing")
    names = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "tr[data-schedule] td a")]
    assert names == ["partner webhook"]


def test_form_explains_the_day_forms_and_their_dst_warning(live_server, browser, alice, tenant_a):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver = browser
    _login(driver, live_server.url, "alice", "pw-alice-123")
    driver.get(f"{live_server.url}/schedules/new/")
    expression = driver.find_element(By.NAME, "expression")
    for rule, words in [
        ("0 0 L * *", "At 00:00, on the last day of the month"),
        ("0 9 ? * MON#2", "At 09:00, on the second Monday of the month"),
        ("0 18 LW * *", "At 18:00, on the last weekday of the month"),
    ]:
        expression.send_keys(Keys.CONTROL, "a")
        expression.send_keys(rule)
        _wait(driver, lambda d, words=words: _words(d) == words)
    expression.send_keys(Keys.CONTROL, "a")
    expression.send_keys("0 9 * * MON#6")
    _wait(driver, lambda d: "the n of d#n must be 1-5" in _words(d))
    # Europe/London springs forward on the last Sunday of March at 01:00: a rule for 01:30 on
    # the last Sunday of each month meets the gap.
    expression.send_keys(Keys.CONTROL, "a")
    expression.send_keys("30 1 * * SUNL")
    zone = driver.find_element(By.NAME, "time_zone")
    zone.send_keys(Keys.CONTROL, "a")
    zone.send_keys("Europe/London")
    _wait(driver, lambda d: "01:30 does not exist on" in _warning(d))
    assert _words(driver) == "At 01:30, on the last Sunday of the month"
    driver.find_element(By.NAME, "name").send_keys("month-end sweep")
    _shot(driver, "schedule-form-day-forms")
