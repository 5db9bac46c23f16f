"""The next fires a schedule shows (docs/api.md "The next run of a schedule"): the next five
instants it will run, from its next run — the pending occurrences written ahead by the
materializer, then the rule's instants after them — not from the materializer's cursor."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine

from apps.occurrences.models import Occurrence
from apps.occurrences.pipeline.materializer import materialize_pass
from apps.occurrences.tests.support.pipeline import leases, materialize_config
from apps.occurrences.tests.support.queries import schedule_list_queries, schedule_list_rows
from apps.occurrences.tests.support.rows import occurrence
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule
from apps.tenants.models import Tenant

pytestmark = pytest.mark.django_db

# Pinned: the pass, the API's "now" and the pause/resume/update all read this clock.
NOW = datetime(2026, 12, 2, 12, 0, 30, tzinfo=UTC)


def at(minute: int, second: int = 0) -> datetime:
    return datetime(2026, 12, 2, 12, minute, second, tzinfo=UTC)


def text(*instants: datetime) -> list[str]:
    return [t.strftime("%Y-%m-%dT%H:%M:%SZ") for t in instants]


def minutes(*values: int) -> list[str]:
    return text(*(at(m) for m in values))


def every_minute(tenant: Tenant, **fields: Any) -> Schedule:
    """An every-minute schedule created at NOW (its first instant 12:01), in shard 0: with a
    window of 120 s and a span of 240 s a pass at NOW writes 12:01 to 12:04 ahead and leaves
    its cursor at 12:05 (docs/decisions.md "Fewer advances: a schedule written a span
    ahead")."""
    made = make_schedule(tenant, **fields)
    Schedule.objects.filter(pk=made.pk).update(shard=0)
    made.refresh_from_db()
    return made


def materialize() -> None:
    materialize_pass(leases=leases(), now=NOW, config=materialize_config(window_s=120, span_s=240))


def shown(api: Any, made: Schedule) -> dict[str, Any]:
    response = api.get(f"/api/v1/schedules/{made.id}")
    assert response.status_code == 200, response.content
    body: dict[str, Any] = response.json()
    return body


@time_machine.travel(NOW, tick=False)
def test_after_a_pass_written_a_span_ahead_the_next_fires_start_at_the_next_run(api_a, tenant_a):
    # given: an every-minute schedule whose 12:01 to 12:04 are written ahead, cursor 12:05
    made = every_minute(tenant_a)
    materialize()
    made.refresh_from_db()
    assert made.next_run_at == at(5)

    body = shown(api_a, made)
    row = schedule_list_rows(api_a)[str(made.id)]

    # then: the next five minutes, the first of them the next run, on both answers
    assert body["next_run_at"] == "2026-12-02T12:01:00Z"
    assert body["next_fires"] == minutes(1, 2, 3, 4, 5)
    assert body["next_fires"][0] == body["next_run_at"]
    assert (row["next_run_at"], row["next_fires"]) == (body["next_run_at"], body["next_fires"])


@time_machine.travel(NOW, tick=False)
def test_a_run_not_yet_started_is_listed_until_it_starts(api_a, tenant_a):
    # given: 12:00 published but not started (due now), 12:01 to 12:04 written ahead
    made = every_minute(tenant_a)
    materialize()
    due_now = occurrence(made, at(0))

    assert shown(api_a, made)["next_fires"] == minutes(0, 1, 2, 3, 4)

    # when: it starts
    Occurrence.objects.filter(id=due_now.id).update(state=Occurrence.State.RUNNING)

    assert shown(api_a, made)["next_fires"] == minutes(1, 2, 3, 4, 5)


@time_machine.travel(NOW, tick=False)
def test_a_paused_schedule_lists_no_fire_and_a_resumed_one_its_restored_instants(api_a, tenant_a):
    made = every_minute(tenant_a)
    materialize()

    paused = api_a.post(f"/api/v1/schedules/{made.id}/pause")

    assert paused.status_code == 200, paused.content
    assert (paused.json()["schedule"]["next_run_at"], paused.json()["schedule"]["next_fires"]) == (
        None, [],
    )  # fmt: skip
    assert shown(api_a, made)["next_fires"] == []
    assert schedule_list_rows(api_a)[str(made.id)]["next_fires"] == []

    # when: resumed — the pause canceled 12:01 to 12:04, still ahead: restored
    resumed = api_a.post(f"/api/v1/schedules/{made.id}/resume")

    assert resumed.status_code == 200, resumed.content
    assert len(resumed.json()["receipt"]["restored"]) == 4
    assert resumed.json()["schedule"]["next_fires"] == minutes(1, 2, 3, 4, 5)
    assert shown(api_a, made)["next_fires"] == minutes(1, 2, 3, 4, 5)


@time_machine.travel(NOW, tick=False)
def test_end_at_cuts_the_next_fires(api_a, tenant_a):
    # given: every minute until 12:05 (half-open: 12:05 is no run), in shard 192 (its cut of
    # the span: 12:03): a pass writes 12:01 to 12:03 and leaves its cursor at 12:04
    made = every_minute(tenant_a, end_at=at(5))
    Schedule.objects.filter(pk=made.pk).update(shard=192)
    materialize()
    made.refresh_from_db()
    assert (made.state, made.next_run_at) == (Schedule.State.ACTIVE, at(4))

    body = shown(api_a, made)

    assert body["next_fires"] == minutes(1, 2, 3, 4)


@time_machine.travel(NOW, tick=False)
def test_a_one_shot_lists_its_instant_while_active(api_a, tenant_a):
    # given: a one-shot at 12:10, beyond the window: not written yet
    one_shot = make_schedule(tenant_a, kind=Schedule.Kind.ONE_SHOT, expression="", run_at=at(10))

    body = shown(api_a, one_shot)

    assert (body["state"], body["next_run_at"], body["next_fires"]) == (
        "ACTIVE", "2026-12-02T12:10:00Z", ["2026-12-02T12:10:00Z"],
    )  # fmt: skip


@time_machine.travel(NOW, tick=False)
def test_a_one_shot_written_ahead_is_completed_and_lists_no_fire(api_a, tenant_a):
    # given: a one-shot at 12:02, inside the window: a pass writes it (docs/api.md)
    one_shot = make_schedule(tenant_a, kind=Schedule.Kind.ONE_SHOT, expression="", run_at=at(2))
    materialize()

    body = shown(api_a, one_shot)

    assert Occurrence.objects.filter(schedule=one_shot, state=Occurrence.State.SCHEDULED).exists()
    assert (body["state"], body["next_run_at"], body["next_fires"]) == ("COMPLETED", None, [])


@time_machine.travel(NOW, tick=False)
def test_an_interval_schedule_lists_its_period_from_the_next_run(api_a, tenant_a):
    # given: every 90 s from 12:00:00, written ahead by a pass
    made = make_schedule(
        tenant_a, kind=Schedule.Kind.INTERVAL, expression="", interval_s=90, start_at=at(0)
    )
    Schedule.objects.filter(pk=made.pk).update(shard=0)
    materialize()

    body = shown(api_a, made)

    first = at(1, 30)
    assert body["next_run_at"] == text(first)[0]
    assert body["next_fires"] == text(*(first + timedelta(seconds=90 * k) for k in range(5)))
    assert Occurrence.objects.filter(schedule=made).count() >= 2  # some of them written ahead


@time_machine.travel(NOW, tick=False)
def test_a_retry_waiting_is_the_next_run_but_no_fire(api_a, tenant_a):
    # given: 11:59 failed once and waits to retry; 12:01 to 12:04 written ahead
    made = every_minute(tenant_a)
    materialize()
    occurrence(made, datetime(2026, 12, 2, 11, 59, tzinfo=UTC), state=Occurrence.State.RETRY_WAIT)

    body = shown(api_a, made)

    assert body["next_run_at"] == "2026-12-02T11:59:00Z"
    assert body["next_fires"] == minutes(1, 2, 3, 4, 5)


@time_machine.travel(NOW, tick=False)
def test_a_run_now_is_no_fire_of_the_rule(api_a, tenant_a):
    made = every_minute(tenant_a)
    materialize()

    ran = api_a.post(f"/api/v1/schedules/{made.id}/run", {}, format="json")

    assert ran.status_code in (200, 202), ran.content
    assert shown(api_a, made)["next_fires"] == minutes(1, 2, 3, 4, 5)


@time_machine.travel(NOW, tick=False)
def test_an_update_lists_the_new_rule_not_the_superseded_instants(api_a, tenant_a):
    # given: every minute, 12:01 to 12:04 written ahead
    made = every_minute(tenant_a)
    materialize()

    # when: changed to every other minute
    changed = api_a.patch(
        f"/api/v1/schedules/{made.id}", {"expression": "*/2 * * * *"}, format="json"
    )

    # then: the written instants are superseded; the new version's instants are listed
    assert changed.status_code == 200, changed.content
    assert changed.json()["schedule"]["next_fires"] == minutes(2, 4, 6, 8, 10)
    assert shown(api_a, made)["next_fires"] == minutes(2, 4, 6, 8, 10)
    assert not Occurrence.objects.filter(
        schedule=made, state=Occurrence.State.SCHEDULED, schedule_version=1
    ).exists()


@time_machine.travel(NOW, tick=False)
def test_the_list_reads_next_fires_for_the_whole_page_in_one_query(api_a, tenant_a):
    for _ in range(2):
        every_minute(tenant_a)
    materialize()
    two = schedule_list_queries(api_a)
    for _ in range(5):
        every_minute(tenant_a)
    materialize()
    seven = schedule_list_queries(api_a)

    assert seven == two
    rows = schedule_list_rows(api_a).values()
    assert len(rows) == 7
    assert all(row["next_fires"] == minutes(1, 2, 3, 4, 5) for row in rows)
