"""The next run on the schedule pages is the API's (docs/ui.md): a paused schedule shows its
state where an active one lists its next fires, and the list shows no next run for it."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
import time_machine

from apps.occurrences.models import Occurrence
from apps.occurrences.tests.support.rows import occurrence, schedule
from apps.schedules.models import Schedule

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 2, 12, 0, 30, tzinfo=UTC)


def at(hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 12, 2, hour, minute, tzinfo=UTC)


def _next_run_cells(page: str) -> dict[str, str]:
    """Schedule name → the text of its "Next run" cell on the list page."""
    cells = re.findall(r'>([^<>]+)</a></td>.*?<td class="next-run">(.*?)</td>', page, re.S)
    return {name: re.sub(r"<[^>]+>", "", cell).strip() for name, cell in cells}


@time_machine.travel(NOW, tick=False)
def test_a_paused_schedule_page_says_paused_and_lists_no_next_fire(client, alice, tenant_a):
    hourly = schedule(tenant_a, name="hourly", next_run_at=at(13))
    client.force_login(alice)

    paused = client.post(f"/schedules/{hourly.id}/pause/")
    again = client.get(f"/schedules/{hourly.id}/")

    for response in (paused, again):
        page = response.content.decode()
        assert response.status_code == 200
        assert response.context["preview"] == []
        assert 'class="preview"' not in page
        assert re.search(r'id="next-fires-state">.*?Paused', page, re.S)
        assert re.search(r'<dd id="next-run">\s*Paused\s*</dd>', page)
        # (the event log may still say where the pause found the timetable)
        assert "2026-12-02 13:00" not in page.split('id="events"', 1)[0]


@time_machine.travel(NOW, tick=False)
def test_a_resumed_schedule_page_lists_next_fires_again(client, alice, tenant_a):
    hourly = schedule(tenant_a, name="hourly", next_run_at=at(13))
    client.force_login(alice)
    client.post(f"/schedules/{hourly.id}/pause/")

    resumed = client.post(f"/schedules/{hourly.id}/resume/")

    page = resumed.content.decode()
    assert len(resumed.context["preview"]) == 10
    assert 'id="next-fires-state"' not in page
    assert re.search(r'<dd id="next-run">2026-12-02 13:00:00 UTC</dd>', page)


@time_machine.travel(NOW, tick=False)
def test_the_list_shows_the_apis_next_run(client, alice, tenant_a):
    late = schedule(tenant_a, name="late one", next_run_at=at(13))
    occurrence(late, at(12), state=Occurrence.State.ENQUEUED)  # published, not run yet
    schedule(tenant_a, name="on time", next_run_at=at(13))
    paused = schedule(tenant_a, name="paused one", next_run_at=at(13))
    Schedule.objects.filter(pk=paused.pk).update(state=Schedule.State.PAUSED)
    client.force_login(alice)

    cells = _next_run_cells(client.get("/schedules/").content.decode())

    assert cells == {
        "late one": "2026-12-02 12:00:00 UTC",
        "on time": "2026-12-02 13:00:00 UTC",
        "paused one": "none (paused)",
    }


@time_machine.travel(NOW, tick=False)
def test_the_detail_page_shows_a_pending_occurrence_as_the_next_run(client, alice, tenant_a):
    late = schedule(tenant_a, name="late one", next_run_at=at(13))
    occurrence(late, at(12), state=Occurrence.State.RETRY_WAIT)
    client.force_login(alice)

    page = client.get(f"/schedules/{late.id}/").content.decode()

    assert re.search(r'<dd id="next-run">2026-12-02 12:00:00 UTC</dd>', page)


@time_machine.travel(NOW, tick=False)
def test_the_detail_pages_next_fires_start_at_the_next_run(client, alice, tenant_a):
    # given: an every-minute schedule whose 12:00 run is published but not started and whose
    # 12:01 to 12:04 are written ahead (cursor 12:05), and a run that waits to retry
    minutely = schedule(tenant_a, name="minutely", expression="* * * * *", next_run_at=at(12, 5))
    occurrence(minutely, at(11, 58), state=Occurrence.State.RETRY_WAIT)
    occurrence(minutely, at(12), state=Occurrence.State.ENQUEUED)
    for minute in range(1, 5):
        occurrence(minutely, at(12, minute), state=Occurrence.State.SCHEDULED)
    client.force_login(alice)

    response = client.get(f"/schedules/{minutely.id}/")

    # then: the retry is the next run; the fires are the ten minutes from 12:00, none lost
    # between the written ones and the cursor
    page = response.content.decode()
    assert re.search(r'<dd id="next-run">2026-12-02 11:58:00 UTC</dd>', page)
    assert [e.at_utc for e in response.context["preview"]] == [at(12, m) for m in range(10)]
    assert all(e.abbreviation == "UTC" for e in response.context["preview"])
