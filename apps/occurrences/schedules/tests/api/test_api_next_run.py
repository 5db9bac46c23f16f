"""The next run a schedule shows (docs/api.md): none unless active; otherwise the earliest
instant not yet run — a pending occurrence or the materializer's cursor, whichever is first."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import time_machine

from apps.occurrences.models import Occurrence
from apps.occurrences.tests.support.queries import schedule_list_queries, schedule_list_rows
from apps.occurrences.tests.support.rows import occurrence, schedule
from apps.schedules.models import Schedule

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 2, 12, 0, 30, tzinfo=UTC)


def at(hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 12, 2, hour, minute, tzinfo=UTC)


@time_machine.travel(NOW, tick=False)
def test_an_enqueued_occurrence_before_the_cursor_is_the_next_run(api_a, tenant_a):
    # given: an hourly schedule materialized up to 13:00 whose 12:00 run is published but
    # not run yet; its 11:00 run is done
    hourly = schedule(tenant_a, next_run_at=at(13))
    occurrence(hourly, at(11), state=Occurrence.State.SUCCEEDED)
    occurrence(hourly, at(12), state=Occurrence.State.ENQUEUED)

    detail = api_a.get(f"/api/v1/schedules/{hourly.id}").json()
    listed = schedule_list_rows(api_a)[str(hourly.id)]

    assert detail["next_run_at"] == "2026-12-02T12:00:00Z"
    assert listed["next_run_at"] == "2026-12-02T12:00:00Z"


@time_machine.travel(NOW, tick=False)
def test_without_a_pending_occurrence_the_next_run_is_the_next_instant_not_materialized(
    api_a, tenant_a
):
    hourly = schedule(tenant_a, next_run_at=at(13))
    occurrence(hourly, at(12), state=Occurrence.State.SUCCEEDED)

    body = api_a.get(f"/api/v1/schedules/{hourly.id}").json()

    assert body["next_run_at"] == "2026-12-02T13:00:00Z"
    assert datetime.fromisoformat(body["next_fires"][0]) == at(13)


@time_machine.travel(NOW, tick=False)
def test_a_paused_schedule_shows_no_next_run_and_a_resumed_one_does_again(api_a, tenant_a):
    hourly = schedule(tenant_a, next_run_at=at(13))
    occurrence(hourly, at(12), state=Occurrence.State.ENQUEUED)

    paused = api_a.post(f"/api/v1/schedules/{hourly.id}/pause")

    assert paused.status_code == 200, paused.content
    assert paused.json()["schedule"]["state"] == "PAUSED"
    assert (paused.json()["schedule"]["next_run_at"], paused.json()["schedule"]["next_fires"]) == (
        None, [],
    )  # fmt: skip
    detail = api_a.get(f"/api/v1/schedules/{hourly.id}").json()
    assert (detail["next_run_at"], detail["next_fires"]) == (None, [])
    listed = schedule_list_rows(api_a)[str(hourly.id)]
    assert (listed["next_run_at"], listed["next_fires"]) == (None, [])

    resumed = api_a.post(f"/api/v1/schedules/{hourly.id}/resume")

    assert resumed.status_code == 200, resumed.content
    # the published 12:00 run was not recalled by the pause: it is still the next to run
    assert resumed.json()["schedule"]["next_run_at"] == "2026-12-02T12:00:00Z"
    assert api_a.get(f"/api/v1/schedules/{hourly.id}").json()["next_run_at"] == (
        "2026-12-02T12:00:00Z"
    )
    assert resumed.json()["schedule"]["next_fires"] != []


@time_machine.travel(NOW, tick=False)
@pytest.mark.parametrize("state", [Schedule.State.CANCELED, Schedule.State.COMPLETED])
def test_a_schedule_that_never_fires_again_shows_no_next_run(api_a, tenant_a, state):
    # next_run_at is left in place to show it is the state, not the cursor, that decides
    hourly = schedule(tenant_a, next_run_at=at(13))
    occurrence(hourly, at(12), state=Occurrence.State.ENQUEUED)
    Schedule.objects.filter(pk=hourly.pk).update(state=state)

    detail = api_a.get(f"/api/v1/schedules/{hourly.id}").json()
    listed = schedule_list_rows(api_a)[str(hourly.id)]

    assert (detail["next_run_at"], detail["next_fires"]) == (None, [])
    assert (listed["next_run_at"], listed["next_fires"]) == (None, [])


@time_machine.travel(NOW, tick=False)
def test_a_pending_occurrence_of_an_older_version_is_not_the_next_run(api_a, tenant_a):
    hourly = schedule(tenant_a, next_run_at=at(13))
    occurrence(hourly, at(12), state=Occurrence.State.ENQUEUED)
    Schedule.objects.filter(pk=hourly.pk).update(version=2)

    assert api_a.get(f"/api/v1/schedules/{hourly.id}").json()["next_run_at"] == (
        "2026-12-02T13:00:00Z"
    )


@time_machine.travel(NOW, tick=False)
def test_the_list_reads_next_runs_for_the_whole_page_in_one_query(api_a, tenant_a):
    for _ in range(2):
        occurrence(schedule(tenant_a, next_run_at=at(13)), at(12))
    two = schedule_list_queries(api_a)
    for _ in range(5):
        occurrence(schedule(tenant_a, next_run_at=at(13)), at(12))
    seven = schedule_list_queries(api_a)

    assert seven == two
    assert {row["next_run_at"] for row in schedule_list_rows(api_a).values()} == {
        "2026-12-02T12:00:00Z"
    }
