"""Pages stay short (docs/ui.md "Pages stay short"): the schedule page shows each recent
occurrence's attempt count and last error, not its attempts; every list inside a page shows
10 rows and a "Show more" link."""

from __future__ import annotations

import re

import pytest

from apps.occurrences.alerts.configure import ChannelSpec, channel_create
from apps.occurrences.schedules.tests.web.long_history import failing_schedule
from apps.tenants.services import api_key_create

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("partitions_around_today")]


def _rows(page: str, section: str) -> int:
    body = page.split(f'id="{section}"', 1)[1].split("</section>", 1)[0]
    return len(re.findall(r"<tr[ >]", body)) - 1  # the header row


def test_the_schedule_page_shows_counts_and_the_last_error(client, alice, tenant_a):
    sched, latest = failing_schedule(tenant_a)
    client.force_login(alice)

    page = client.get(f"/schedules/{sched.id}/").content.decode()

    assert _rows(page, "recent") == 10 and _rows(page, "events") == 10
    row = re.search(rf'<tr data-occurrence="{latest.id}">.*?</tr>', page, re.S)
    assert row is not None
    assert "15 attempts" in row.group(0) and "try 15:" in row.group(0)
    assert page.count("ConnectError — try") == 10  # one last error a row, not one an attempt
    assert 'href="?show=recent#more-recent"' in page and 'href="?show=events#more-events"' in page


def test_show_more_lists_the_rest(client, alice, tenant_a):
    sched, latest = failing_schedule(tenant_a)
    client.force_login(alice)

    recent = client.get(f"/schedules/{sched.id}/?show=recent").content.decode()
    events = client.get(f"/schedules/{sched.id}/?show=events").content.decode()
    attempts = client.get(f"/occurrences/{latest.id}/").content.decode()
    all_attempts = client.get(f"/occurrences/{latest.id}/?show=attempts").content.decode()

    assert _rows(recent, "recent") == 25 and _rows(recent, "events") == 10
    assert _rows(events, "events") == 13  # created, then 6 pauses and 6 resumes
    assert _rows(attempts, "attempts") == 10 and "try 15:" in attempts
    assert "try 1:" not in attempts and 'href="?show=attempts#more-attempts"' in attempts
    assert _rows(all_attempts, "attempts") == 15 and "Show fewer" in all_attempts


def test_lists_on_other_pages_are_capped_too(client, alice, tenant_a, settings):
    settings.TICK_ALERT_CONFIRMATIONS_PER_HOUR = 20  # twelve e-mail channels, each confirmed
    for n in range(12):
        api_key_create(tenant=tenant_a, name=f"key {n:02d}", actor="t")
        channel_create(tenant=tenant_a, spec=ChannelSpec(name=f"ops {n:02d}", kind="email",
                       target=f"ops{n}@example.com"), actor="t")  # fmt: skip
    client.force_login(alice)

    keys = client.get("/keys/").content.decode()
    all_keys = client.get("/keys/?show=keys").content.decode()
    alerts = client.get("/alerts/").content.decode()

    assert len(re.findall(r">key \d\d<", keys)) == 10 and 'href="?show=keys#more-keys"' in keys
    assert len(re.findall(r">key \d\d<", all_keys)) == 12
    assert len(re.findall(r"<tr data-channel=", alerts)) == 10
    assert 'href="?show=channels#more-channels"' in alerts
