"""The schedule form's fixed rate: "every 90 minutes" saved as interval_s, refused with the
API's message under the field, shown in words, editable with its period in the largest unit."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import time_machine

from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule

pytestmark = pytest.mark.django_db

FROZEN = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)
FORM = {
    "name": "sync", "kind": "interval", "interval_every": "90", "interval_unit": "60",
    "time_zone": "Europe/Berlin", "precision": "strict", "misfire_policy": "fire_once",
    "overlap_policy": "allow", "dst_gap": "skip", "dst_fold": "first", "handler": "noop",
    "payload": "",
}  # fmt: skip


@time_machine.travel(FROZEN, tick=False)
def test_form_creates_a_fixed_rate_and_the_page_says_it_in_words(client, alice, tenant_a):
    client.force_login(alice)

    response = client.post("/schedules/new/", FORM)

    assert response.status_code == 302, response.content
    schedule = Schedule.objects.get(tenant=tenant_a)
    assert (schedule.kind, schedule.interval_s, schedule.start_at) == (
        Schedule.Kind.INTERVAL, 5400, FROZEN,
    )  # fmt: skip
    page = client.get(f"/schedules/{schedule.id}/").content.decode()
    assert "Every 90 minutes from 2026-12-04 09:00 UTC" in page


@time_machine.travel(FROZEN, tick=False)
def test_form_refuses_a_period_under_a_minute_under_the_field(client, alice, tenant_a):
    client.force_login(alice)

    response = client.post(
        "/schedules/new/", {**FORM, "interval_every": "30", "interval_unit": "1"}
    )

    assert response.status_code == 400
    assert "once a minute" in " ".join(response.context["form"].errors["interval_every"])
    assert Schedule.objects.count() == 0


@time_machine.travel(FROZEN, tick=False)
def test_the_live_preview_shows_a_fixed_rates_runs(client, alice, tenant_a):
    client.force_login(alice)

    response = client.post("/schedules/preview/", {**FORM, "start_at": "2027-10-31T00:30:00Z"})

    assert response.status_code == 200
    text = response.content.decode()
    # 00:30Z is 02:30 CEST; 90 minutes later the clocks have fallen back: 03:00 CET
    assert "2027-10-31 02:30 CEST" in text and "2027-10-31 03:00 CET" in text
    assert "Every 90 minutes from 2027-10-31 00:30 UTC" in text


@time_machine.travel(FROZEN, tick=False)
def test_edit_form_shows_the_period_in_its_largest_unit(client, alice, tenant_a):
    schedule = make_schedule(
        tenant_a, name="sync", kind=Schedule.Kind.INTERVAL, expression="", interval_s=129600,
        start_at=FROZEN, handler="noop",
    )  # fmt: skip
    client.force_login(alice)

    page = client.get(f"/schedules/{schedule.id}/edit/").content.decode()

    assert 'name="interval_every" value="36"' in page
    assert '<option value="3600" selected>hours</option>' in page
