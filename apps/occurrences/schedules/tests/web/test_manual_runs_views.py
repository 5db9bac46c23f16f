"""Run now and backfill on the schedule page (server side): the form's request id makes a
resubmitted form run once, the dialog's preview writes nothing, the tenancy trio."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.utils import timezone

from apps.occurrences.models import Occurrence
from apps.occurrences.tests.support import rows

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.usefixtures("partitions_around_today"),
    pytest.mark.clock_edge,
]


def _hour(hours_ago: int) -> datetime:
    top = timezone.now().astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return top - timedelta(hours=hours_ago)


def _local(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M")  # the dialog's datetime-local inputs, read as UTC


def test_run_now_form_resubmitted_runs_once_and_shows_the_receipt(client, alice, tenant_a):
    schedule = rows.schedule(tenant_a)
    client.force_login(alice)
    page = client.get(f"/schedules/{schedule.id}/")
    request_id = page.context["run_request_id"]

    first = client.post(f"/schedules/{schedule.id}/run/", {"request_id": request_id}, follow=True)
    again = client.post(f"/schedules/{schedule.id}/run/", {"request_id": request_id}, follow=True)
    reload = client.get(f"/schedules/{schedule.id}/")

    # post/redirect/get: the address bar leaves /run/; the receipt is shown once
    assert first.redirect_chain == [(f"/schedules/{schedule.id}/", 302)]
    assert first.status_code == 200 and first.context["run_receipt"].replayed is False
    assert reload.context["run_receipt"] is None
    assert again.context["run_receipt"].replayed is True
    manual = Occurrence.objects.get(schedule=schedule, origin=Occurrence.Origin.MANUAL)
    assert manual.requested_by == "user:alice"
    body = again.content.decode()
    assert 'id="run-receipt"' in body and "nothing new was created" in body
    assert "Run now · user:alice" in body  # the recent occurrences table


def test_backfill_preview_writes_nothing_and_confirm_runs_the_missed(client, alice, tenant_a):
    schedule = rows.schedule(tenant_a)
    rows.occurrence(schedule, _hour(3), state=Occurrence.State.MISSED)
    rows.occurrence(schedule, _hour(2), state=Occurrence.State.SUCCEEDED)
    client.force_login(alice)
    form = {"from": _local(_hour(4)), "to": _local(_hour(0)), "only": "missed"}

    preview = client.post(f"/schedules/{schedule.id}/backfill/preview/", form)

    assert preview.status_code == 200
    assert preview.context["preview"].queued == 3  # 4 h ago, 3 h ago (missed), 1 h ago
    assert 'id="backfill-count">3<' in preview.content.decode()
    assert not Occurrence.objects.filter(schedule=schedule, origin="backfill").exists()

    done = client.post(f"/schedules/{schedule.id}/backfill/", form)

    assert done.context["backfill_receipt"].queued == 3
    assert Occurrence.objects.filter(schedule=schedule, origin="backfill").count() == 3


def test_backfill_preview_shows_field_errors(client, alice, tenant_a):
    schedule = rows.schedule(tenant_a)
    client.force_login(alice)
    future = timezone.now() + timedelta(hours=2)

    preview = client.post(
        f"/schedules/{schedule.id}/backfill/preview/",
        {"from": _local(_hour(1)), "to": _local(future), "only": "missed"},
    )

    assert "to" in preview.context["errors"]
    assert "Must not be in the future" in preview.content.decode()


def test_viewer_gets_403_and_outsider_404_and_nothing_runs(client, bob, charlie, tenant_a):
    schedule = rows.schedule(tenant_a)
    form = {"from": _local(_hour(3)), "to": _local(_hour(0)), "only": "all"}
    for user, expected in ((bob, 403), (charlie, 404)):
        client.force_login(user)
        assert client.post(f"/schedules/{schedule.id}/run/").status_code == expected
        for url in ("backfill/", "backfill/preview/"):
            assert client.post(f"/schedules/{schedule.id}/{url}", form).status_code == expected
    assert not Occurrence.objects.filter(schedule=schedule).exists()


def _dialog_values(page: str) -> dict[str, str]:
    return dict(re.findall(r'id="backfill-(from|to)" value="([^"]*)"', page))


@time_machine.travel(datetime(2026, 12, 3, 23, 45, 30, tzinfo=UTC), tick=False)
def test_the_backfill_dialog_opens_on_a_range_that_fits_in_24_hour_utc(client, alice, tenant_a):
    # given: an every-minute rule (1,440 instants a day, over the cap) and an hourly one
    minutely = rows.schedule(tenant_a, name="minutely", expression="* * * * *")
    hourly = rows.schedule(tenant_a, name="hourly")
    client.force_login(alice)

    # when: each page is opened and the dialog's default range previewed as it opens
    ranges = {s.name: _dialog_values(client.get(f"/schedules/{s.id}/").content.decode())
              for s in (minutely, hourly)}  # fmt: skip
    preview = client.post(
        f"/schedules/{minutely.id}/backfill/preview/", {**ranges["minutely"], "only": "all"}
    )

    # then: the last hour for the minutely rule, the last 24 h for the hourly; 24-hour UTC
    assert ranges["minutely"] == {"from": "2026-12-03 22:45", "to": "2026-12-03 23:45"}
    assert ranges["hourly"] == {"from": "2026-12-02 23:45", "to": "2026-12-03 23:45"}
    assert preview.context["errors"] == {} and preview.context["preview"].instants == 60
    assert "error" not in preview.content.decode()
