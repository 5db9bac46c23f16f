"""The dashboard and the schedule list say what is so for a new tenant (docs/ui.md
"Dashboard"): with an active schedule that has not run yet, no "create a schedule"; a
schedule created this week without a run is "new", not "no run in 7 days"."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.occurrences.tests.support.rows import schedule
from apps.schedules.models import Schedule

pytestmark = [pytest.mark.django_db, pytest.mark.clock_edge]


def test_an_active_schedule_without_runs_yet_is_no_empty_tenant(client, alice, tenant_a):
    client.force_login(alice)
    empty = client.get("/").content.decode()
    schedule(tenant_a, name="demo")  # hourly: its first run is up to an hour ahead

    page = client.get("/").content.decode()

    assert 'id="no-schedule"' in empty and "Create a schedule" in empty
    assert "Create a schedule" not in page
    first = re.search(r'<p class="empty" id="first-run">(.*?)</p>', page, re.S)
    assert first is not None and "1 active schedule, the next run is due 20" in first.group(1)


def test_a_new_schedule_reads_new_and_an_old_one_no_run_in_7_days(client, alice, tenant_a):
    schedule(tenant_a, name="fresh")
    old = schedule(tenant_a, name="old")
    Schedule.objects.filter(id=old.id).update(created_at=timezone.now() - timedelta(days=8))
    client.force_login(alice)

    page = client.get("/schedules/").content.decode()

    def last_run(name: str) -> str:
        row = re.search(rf">{name}</a>.*?<td class=\"last-run\">(.*?)</td>", page, re.S)
        assert row is not None
        return re.sub(r"<[^>]+>", "", row.group(1)).strip()

    assert last_run("fresh") == "new"
    assert last_run("old") == "no run in 7 days"
