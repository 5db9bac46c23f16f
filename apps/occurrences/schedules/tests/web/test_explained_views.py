"""Schedules that explain themselves (docs/ui.md): the DST warning of the coming year on the
form's preview and the detail page, the rule in words endpoint, the form's labels and
Advanced section, the payload as JSON, and the admin index's link to the occurrence browser."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
import time_machine

from apps.schedules.tests.factories import make_schedule

pytestmark = pytest.mark.django_db

# The app's clock (django.utils.timezone.now) pinned to "today" of this project, at an
# instant that is not minute-aligned, like any real one.
TODAY = datetime(2026, 12, 3, 9, 0, 7, 250_000, tzinfo=UTC)
FORM = {
    "name": "nightly", "kind": "cron", "expression": "30 2 * * *",
    "time_zone": "America/New_York", "precision": "strict", "misfire_policy": "fire_once",
    "overlap_policy": "allow", "dst_gap": "skip", "dst_fold": "first", "handler": "record",
    "payload": "",
}  # fmt: skip
WARNING = (
    "This rule meets a DST change on 2027-03-14: 02:30 does not exist on 2027-03-14 in "
    "America/New_York (clocks jump from 02:00 to 03:00) — skipped"
)


def _warning(page: str) -> str:
    block = re.search(r'<div class="warn" id="dst-warning".*?</div>', page, re.S)
    return " ".join(re.sub(r"<[^>]+>", " ", block.group(0)).split()) if block else ""


@time_machine.travel(TODAY, tick=False)
def test_the_form_preview_warns_of_the_dst_gap_with_the_default_start(client, alice):
    client.force_login(alice)

    skip = client.post("/schedules/preview/", FORM).content.decode()
    shift = client.post("/schedules/preview/", {**FORM, "dst_gap": "shift"}).content.decode()
    nine = client.post("/schedules/preview/", {**FORM, "expression": "0 9 * * *"}).content.decode()

    assert WARNING in _warning(skip)
    # none of the ten fires shown reaches March: the warning does not depend on them
    assert "does not exist" not in skip.split('id="dst-warning"')[1].split("</div>")[1]
    assert "runs once at 03:00 local (07:00 UTC) instead" in _warning(shift)
    assert _warning(nine) == ""


@time_machine.travel(TODAY, tick=False)
def test_the_detail_page_shows_the_same_dst_warning(client, alice, tenant_a):
    schedule = make_schedule(tenant_a, expression="30 2 * * *", time_zone="America/New_York")
    client.force_login(alice)

    page = client.get(f"/schedules/{schedule.id}/").content.decode()

    assert WARNING in _warning(page)
    assert re.search(r'<dd id="rule-words">At 02:30</dd>', page)


def test_the_rule_in_words_endpoint_describes_or_explains(client, bob):
    client.force_login(bob)  # it stores nothing: viewers may use it

    weekdays = client.get("/schedules/describe/", {"expression": "0 9 * * 1-5"})
    never = client.get("/schedules/describe/", {"expression": "0 0 30 2 *"})
    empty = client.get("/schedules/describe/", {"expression": " "})

    assert weekdays.content.decode().strip() == "At 09:00, Monday through Friday"
    assert "never fires" in never.content.decode() and "words-error" in never.content.decode()
    assert empty.content.decode().strip() == ""


def test_the_form_has_human_labels_and_an_advanced_section(client, alice):
    client.force_login(alice)

    page = client.get("/schedules/new/").content.decode()

    common, advanced = page.split('<details class="advanced" id="advanced">')
    for label in ("Cron expression", "Run at", "Time zone (IANA)", "Handler", "Payload (JSON)"):
        assert f">{label}</label>" in common
    for label in ("Flexible window (seconds)", "Local times that do not exist (spring forward)",
                  "When a run is missed", "Timeout (seconds)"):  # fmt: skip
        assert f">{label}</label>" in advanced
    assert "Dst gap" not in page and "Flexible window s" not in page
    assert 'hx-get="/schedules/describe/"' in page


def test_a_refused_advanced_field_opens_the_advanced_section(client, alice):
    client.force_login(alice)

    page = client.post("/schedules/new/", {**FORM, "flexible_window_s": "999"}).content.decode()

    assert '<details class="advanced" id="advanced" open>' in page


def test_the_payload_is_shown_as_json(client, alice, tenant_a):
    schedule = make_schedule(tenant_a, payload={"url": "https://x.test", "retry": True, "n": None})
    client.force_login(alice)

    page = client.get(f"/schedules/{schedule.id}/").content.decode()

    payload = re.search(r'<pre class="json" id="payload">(.*?)</pre>', page, re.S)
    assert payload is not None
    assert payload.group(1) == (
        "{\n  &quot;n&quot;: null,\n  &quot;retry&quot;: true,\n"
        "  &quot;url&quot;: &quot;https://x.test&quot;\n}"
    )


def test_the_admin_index_links_the_occurrence_browser(admin_client):
    page = admin_client.get("/admin/").content.decode()

    assert re.search(r'<a href="/admin/occurrences/browse/">Occurrence browser</a>', page)
    assert admin_client.get("/admin/occurrences/browse/").status_code == 200
