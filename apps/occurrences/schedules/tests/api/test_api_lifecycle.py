"""Update, pause, resume and cancel through the API: receipts, versions, events, outbox."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine
from django.forms.models import model_to_dict

from apps.occurrences.models import DispatchOutbox, Occurrence, occurrence_id_for
from apps.occurrences.pipeline.materializer import materialize_pass
from apps.occurrences.tests.support.pipeline import leases, materialize_config
from apps.schedules.models import Schedule, ScheduleEvent, ScheduleVersion
from apps.schedules.tests.factories import make_schedule

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 2, 12, 0, 30, tzinfo=UTC)


def at(minute: int, hour: int = 12) -> datetime:
    return datetime(2026, 12, 2, hour, minute, tzinfo=UTC)


_LEASES: list[Any] = []


@pytest.fixture(autouse=True)
def _one_lease_set() -> Any:
    # One materializer process per test: a second LeaseSet of the same owner would find every
    # shard taken (by the first) and materialize nothing.
    _LEASES.clear()
    yield
    _LEASES.clear()


def _materialize(now: datetime) -> Any:
    if not _LEASES:
        _LEASES.append(leases())
    return materialize_pass(leases=_LEASES[0], now=now, config=materialize_config(window_s=120))


def _materialized(tenant: Any, **overrides: Any) -> Schedule:
    """An every-minute schedule materialized at NOW: v1 occurrences at 12:01 and 12:02."""
    schedule = make_schedule(tenant, next_run_at=at(1), **overrides)
    _materialize(NOW)
    return schedule


def _publish(schedule: Schedule, instant: datetime) -> Occurrence:
    """What the relay's record step does after a confirm: ENQUEUED, outbox row gone."""
    occurrence = Occurrence.objects.get(schedule=schedule, scheduled_for=instant)
    Occurrence.objects.filter(pk=occurrence.pk).update(state="ENQUEUED", enqueued_at=NOW)
    DispatchOutbox.objects.filter(occurrence_id=occurrence.id).delete()
    return occurrence


def _recalled(api: Any, tenant: Any, action: str) -> tuple[Schedule, dict[str, Any]]:
    """`action` (pause, cancel) on a schedule materialized at NOW whose 12:01 occurrence was
    published: the 12:02 one is invalidated, the published one is named as not recalled.
    Returns the schedule and the response body."""
    schedule = _materialized(tenant)
    published = _publish(schedule, at(1))

    response = api.post(f"/api/v1/schedules/{schedule.id}/{action}")

    assert response.status_code == 200, response.content
    body: dict[str, Any] = response.json()
    assert body["receipt"]["invalidated"] == [str(occurrence_id_for(schedule.id, 1, at(2)))]
    assert [n["id"] for n in body["receipt"]["not_recalled"]] == [str(published.id)]
    return schedule, body


def _repeat_changes_nothing(api: Any, schedule: Schedule, action: str, event: str) -> None:
    """The same action again is a no-op: an empty receipt, no second `event`."""
    again = api.post(f"/api/v1/schedules/{schedule.id}/{action}")
    assert again.status_code == 200
    assert again.json()["receipt"]["invalidated"] == []
    assert ScheduleEvent.objects.filter(schedule=schedule, kind=event).count() == 1


def _states(schedule: Schedule) -> dict[tuple[int, datetime], str]:
    return {
        (o.schedule_version, o.scheduled_for): o.state
        for o in Occurrence.objects.filter(schedule=schedule)
    }


@time_machine.travel(NOW, tick=False)
def test_update_supersedes_unpublished_old_occurrences_and_never_refires_a_published_instant(
    api_a, tenant_a
):
    # given: v1 materialized 12:01 and 12:02; 12:01 was already published
    schedule = _materialized(tenant_a)
    published = _publish(schedule, at(1))
    pending_id = occurrence_id_for(schedule.id, 1, at(2))

    # when: a change that fires at the same instants (another zone, whole-hour offset)
    response = api_a.patch(
        f"/api/v1/schedules/{schedule.id}", {"time_zone": "Europe/Berlin"}, format="json"
    )

    # then
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["receipt"] == {
        "action": "updated",
        "at": "2026-12-02T12:00:30Z",
        "version": 2,
        "invalidated": [str(pending_id)],
        "dropped_at_claim": [],
        "invalidated_state": "SUPERSEDED",
        "not_recalled": [
            {
                "id": str(published.id),
                "state": "ENQUEUED",
                "scheduled_for": "2026-12-02T12:01:00Z",
                "schedule_version": 1,
            }
        ],
        "restored": [],
    }
    # 12:01 was produced by v1 and published: v2 starts at 12:02 (re-fires the superseded one)
    assert body["schedule"]["version"] == 2
    assert body["schedule"]["next_run_at"] == "2026-12-02T12:02:00Z"
    assert _states(schedule) == {(1, at(1)): "ENQUEUED", (1, at(2)): "SUPERSEDED"}
    assert DispatchOutbox.objects.filter(schedule_id=schedule.id).count() == 0
    versions = list(ScheduleVersion.objects.filter(schedule=schedule).order_by("version"))
    assert [(v.version, v.valid_from, v.valid_to) for v in versions] == [
        (1, versions[0].valid_from, NOW),
        (2, NOW, None),
    ]
    assert versions[1].definition["time_zone"] == "Europe/Berlin"
    event = ScheduleEvent.objects.get(schedule=schedule, kind="updated")
    assert (event.version, event.actor[:9], event.detail["changed"]) == (
        2, "api-key:t", ["time_zone"],
    )  # fmt: skip

    # and the materializer now writes v2 from 12:02 on, nothing of v1
    _materialize(NOW)
    assert _states(schedule) == {
        (1, at(1)): "ENQUEUED",
        (1, at(2)): "SUPERSEDED",
        (2, at(2)): "SCHEDULED",
    }
    assert list(DispatchOutbox.objects.values_list("schedule_version", "scheduled_for")) == [
        (2, at(2))
    ]


@time_machine.travel(NOW, tick=False)
def test_name_only_change_keeps_the_version_and_touches_no_occurrence(api_a, tenant_a):
    schedule = _materialized(tenant_a)

    response = api_a.patch(f"/api/v1/schedules/{schedule.id}", {"name": "renamed"}, format="json")

    assert response.status_code == 200, response.content
    assert response.json()["receipt"]["invalidated"] == []
    schedule.refresh_from_db()
    assert (schedule.name, schedule.version) == ("renamed", 1)
    assert set(_states(schedule).values()) == {"SCHEDULED"}
    assert DispatchOutbox.objects.count() == 2


@time_machine.travel(NOW, tick=False)
@pytest.mark.parametrize(
    "field, value",
    [("version", 7), ("state", "PAUSED"), ("next_run_at", "2030-01-01T00:00:00Z"),
     ("tenant", "00000000-0000-0000-0000-000000000000"), ("shard", 3), ("id", "x"),
     ("created_at", "2020-01-01T00:00:00Z"), ("attempt_count", 5)],
)  # fmt: skip
def test_mass_assignment_on_patch_is_refused_and_changes_nothing(api_a, tenant_a, field, value):
    schedule = _materialized(tenant_a)
    before = model_to_dict(Schedule.objects.get(pk=schedule.pk))

    response = api_a.patch(
        f"/api/v1/schedules/{schedule.id}", {"name": "sneaky", field: value}, format="json"
    )

    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]
    assert model_to_dict(Schedule.objects.get(pk=schedule.pk)) == before
    assert ScheduleVersion.objects.filter(schedule=schedule).count() == 1
    assert set(_states(schedule).values()) == {"SCHEDULED"}


@time_machine.travel(NOW, tick=False)
def test_mass_assignment_on_create_is_refused_and_writes_nothing(api_a):
    response = api_a.post(
        "/api/v1/schedules",
        {"name": "x", "kind": "cron", "expression": "0 * * * *", "handler": "record",
         "state": "PAUSED", "version": 9, "next_run_at": "2030-01-01T00:00:00Z"},
        format="json",
    )  # fmt: skip

    assert response.status_code == 400
    assert sorted(response.json()["error"]["fields"]) == ["next_run_at", "state", "version"]
    assert Schedule.objects.count() == 0


@time_machine.travel(NOW, tick=False)
def test_invalid_patch_is_a_field_error_and_changes_nothing(api_a, tenant_a):
    schedule = _materialized(tenant_a)

    response = api_a.patch(
        f"/api/v1/schedules/{schedule.id}", {"expression": "0 0 30 2 *"}, format="json"
    )

    assert response.status_code == 400
    assert "never fires" in response.json()["error"]["fields"]["expression"][0]
    schedule.refresh_from_db()
    assert (schedule.version, schedule.expression) == (1, "* * * * *")


@time_machine.travel(NOW, tick=False)
def test_pause_cancels_unpublished_occurrences_and_stops_materialization(api_a, tenant_a):
    schedule, body = _recalled(api_a, tenant_a, "pause")

    receipt = body["receipt"]
    assert receipt["invalidated_state"] == "CANCELED"
    assert [n["state"] for n in receipt["not_recalled"]] == ["ENQUEUED"]
    schedule.refresh_from_db()
    assert (schedule.state, schedule.next_run_at, schedule.version) == ("PAUSED", at(3), 1)
    assert _states(schedule) == {(1, at(1)): "ENQUEUED", (1, at(2)): "CANCELED"}
    assert DispatchOutbox.objects.count() == 0
    later = NOW + timedelta(minutes=5)
    assert _materialize(later).schedules == 0

    _repeat_changes_nothing(api_a, schedule, "pause", "paused")


def test_resume_lets_the_misfire_policy_judge_instants_missed_while_paused(api_a, tenant_a):
    with time_machine.travel(NOW, tick=False):
        schedule = _materialized(tenant_a, misfire_policy="SKIP", max_lateness_s=60)
        assert api_a.post(f"/api/v1/schedules/{schedule.id}/pause").status_code == 200

    resumed_at = at(30) + timedelta(seconds=30)
    with time_machine.travel(resumed_at, tick=False):
        response = api_a.post(f"/api/v1/schedules/{schedule.id}/resume")
        assert response.status_code == 200, response.content
        assert response.json()["schedule"]["state"] == "ACTIVE"
        # resume continues from the first instant never materialized (12:03)
        assert response.json()["schedule"]["next_run_at"] == "2026-12-02T12:03:00Z"
        _materialize(resumed_at)

    states = _states(schedule)
    # SKIP: 12:03 … 12:29 are older than now - 60 s: the latest 10 are recorded MISSED
    assert sorted(t for (_, t), s in states.items() if s == "MISSED") == [
        at(m) for m in range(20, 30)
    ]
    assert sorted(t for (_, t), s in states.items() if s == "SCHEDULED") == [
        at(m) for m in (30, 31, 32)
    ]
    assert states[(1, at(2))] == "CANCELED"  # canceled by the pause, stays canceled
    event = ScheduleEvent.objects.get(schedule=schedule, kind="resumed")
    assert event.detail["misfire_policy"] == "SKIP"


@time_machine.travel(NOW, tick=False)
def test_cancel_keeps_history_answers_with_a_receipt_and_is_idempotent(api_a, tenant_a):
    schedule, body = _recalled(api_a, tenant_a, "cancel")

    assert (body["schedule"]["state"], body["schedule"]["next_run_at"]) == ("CANCELED", None)
    assert _states(schedule) == {(1, at(1)): "ENQUEUED", (1, at(2)): "CANCELED"}
    assert DispatchOutbox.objects.count() == 0
    assert ScheduleVersion.objects.get(schedule=schedule).valid_to == NOW

    _repeat_changes_nothing(api_a, schedule, "cancel", "canceled")

    deleted = api_a.delete(f"/api/v1/schedules/{schedule.id}")
    assert deleted.status_code == 405
    assert deleted.json()["error"]["code"] == "method_not_allowed"
    assert "never deleted" in deleted.json()["error"]["message"]
    assert Schedule.objects.filter(pk=schedule.pk).exists()
    assert Occurrence.objects.filter(schedule=schedule).count() == 2

    for action in ("pause", "resume"):
        refused = api_a.post(f"/api/v1/schedules/{schedule.id}/{action}")
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "state_conflict"
    patched = api_a.patch(f"/api/v1/schedules/{schedule.id}", {"name": "x"}, format="json")
    assert patched.status_code == 409


@time_machine.travel(NOW, tick=False)
def test_update_of_a_completed_one_shot_reactivates_it(api_a, tenant_a):
    run_at = at(1) + timedelta(seconds=15)
    schedule = make_schedule(
        tenant_a, kind=Schedule.Kind.ONE_SHOT, expression="", run_at=run_at, next_run_at=run_at
    )
    _materialize(NOW)
    schedule.refresh_from_db()
    assert schedule.state == "COMPLETED"  # materialized, not yet published

    response = api_a.patch(
        f"/api/v1/schedules/{schedule.id}", {"run_at": "2026-12-02T13:00:00Z"}, format="json"
    )

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["receipt"]["invalidated"] == [str(occurrence_id_for(schedule.id, 1, run_at))]
    assert (body["schedule"]["state"], body["schedule"]["next_run_at"]) == (
        "ACTIVE", "2026-12-02T13:00:00Z",
    )  # fmt: skip
