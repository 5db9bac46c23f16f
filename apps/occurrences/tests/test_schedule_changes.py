"""Pause, resume and cancel receipts against the real database (and, where a message must
really be published, the real broker): resume restores what the pause canceled, receipts say
whether a recalled occurrence may have been published."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine
from django.conf import settings
from django.utils import timezone

from apps.occurrences.execution.cancel import occurrence_cancel
from apps.occurrences.execution.run import occurrence_execute
from apps.occurrences.models import (
    Attempt,
    DispatchOutbox,
    Occurrence,
    ShardLease,
    occurrence_id_for,
)
from apps.occurrences.pipeline.materializer import materialize_pass
from apps.occurrences.pipeline.queues import all_queue_names
from apps.occurrences.pipeline.relay import Recorder, record_confirmed, relay_step
from apps.occurrences.tests.support.pipeline import leases, materialize_config, relay_config
from apps.schedules.models import Schedule, ScheduleEvent
from apps.schedules.tests.factories import make_schedule

pytestmark = [pytest.mark.django_db, pytest.mark.clock_edge]

NOW = datetime(2026, 12, 2, 12, 0, 30, tzinfo=UTC)  # pause at :30


def at(minute: int, second: int = 0) -> datetime:
    return datetime(2026, 12, 2, 12, minute, second, tzinfo=UTC)


@pytest.fixture
def materialize() -> Any:
    # One materializer lease set per test: a second one of the same owner would hold nothing.
    held = leases()

    def run(now: datetime) -> Any:
        return materialize_pass(leases=held, now=now, config=materialize_config(window_s=120))

    return run


def _paused(api: Any, tenant: Any, materialize: Any, **overrides: Any) -> Schedule:
    """Every minute, materialized at NOW (12:01 and 12:02), then paused at NOW."""
    schedule = make_schedule(tenant, next_run_at=at(1), **overrides)
    with time_machine.travel(NOW, tick=False):
        materialize(NOW)
        paused = api.post(f"/api/v1/schedules/{schedule.id}/pause")
    assert paused.status_code == 200, paused.content
    assert paused.json()["receipt"]["invalidated"] == [
        str(occurrence_id_for(schedule.id, 1, at(m))) for m in (1, 2)
    ]
    return schedule


def _resume(api: Any, schedule: Schedule, when: datetime) -> dict[str, Any]:
    with time_machine.travel(when, tick=False):
        response = api.post(f"/api/v1/schedules/{schedule.id}/resume")
    assert response.status_code == 200, response.content
    body: dict[str, Any] = response.json()
    return body


def _pending(schedule: Schedule) -> dict[datetime, int]:
    """Outbox rows per instant: what the relay will publish."""
    rows: dict[datetime, int] = {}
    for row in DispatchOutbox.objects.filter(schedule_id=schedule.id):
        rows[row.scheduled_for] = rows.get(row.scheduled_for, 0) + 1
    return rows


def _states(schedule: Schedule) -> dict[datetime, list[str]]:
    found: dict[datetime, list[str]] = {}
    for o in Occurrence.objects.filter(schedule=schedule).order_by("scheduled_for"):
        found.setdefault(o.scheduled_for, []).append(o.state)
    return found


def test_resume_before_the_next_instant_restores_it_and_it_runs_once(api_a, tenant_a, materialize):
    # given: paused at 12:00:30, which canceled the materialized 12:01 and 12:02
    schedule = _paused(api_a, tenant_a, materialize)

    # when: resumed at 12:00:40, before 12:01
    body = _resume(api_a, schedule, NOW + timedelta(seconds=10))

    # then: the receipt lists the restored instants, with the same ids the pause canceled
    next_id = occurrence_id_for(schedule.id, 1, at(1))
    assert body["receipt"]["restored"] == [
        {"id": str(next_id), "scheduled_for": "2026-12-02T12:01:00Z"},
        {
            "id": str(occurrence_id_for(schedule.id, 1, at(2))),
            "scheduled_for": "2026-12-02T12:02:00Z",
        },
    ]
    assert body["schedule"]["state"] == "ACTIVE"
    assert _states(schedule) == {at(1): ["SCHEDULED"], at(2): ["SCHEDULED"]}
    assert _pending(schedule) == {at(1): 1, at(2): 1}
    event = ScheduleEvent.objects.get(schedule=schedule, kind=ScheduleEvent.Kind.RESUMED)
    assert event.detail["restored"] == 2
    # the materializer goes on from 12:03 and writes no second 12:01 or 12:02
    assert materialize(at(1, 30)).conflicts == 0
    assert _states(schedule)[at(1)] == ["SCHEDULED"] and _pending(schedule)[at(1)] == 1

    # and 12:01 runs once, however often its message is delivered
    # (claimed at 12:01:05, on time: at today's clock it would be days late and MISSED)
    with time_machine.travel(at(1, 5), tick=True):
        first = occurrence_execute(occurrence_id=next_id, scheduled_for=at(1), worker_id="w1")
        again = occurrence_execute(occurrence_id=next_id, scheduled_for=at(1), worker_id="w2")
    assert first == {"status": "SUCCEEDED", "attempt_no": 1}
    assert again == {"status": "duplicate"}
    assert Attempt.objects.filter(occurrence_id=next_id).count() == 1


def test_an_instant_that_passed_while_paused_is_not_run_and_the_next_one_is(
    api_a, tenant_a, materialize
):
    # given: paused at 12:00:30 (12:01 and 12:02 canceled), SKIP misfire policy
    schedule = _paused(api_a, tenant_a, materialize, misfire_policy="SKIP", max_lateness_s=60)

    # when: resumed at 12:01:30; 12:01 passed while paused
    resumed_at = at(1, 30)
    body = _resume(api_a, schedule, resumed_at)
    materialize(resumed_at)

    # then: 12:01 stays canceled with nothing to publish; 12:02 is back; 12:03 materialized
    assert body["receipt"]["restored"] == [
        {
            "id": str(occurrence_id_for(schedule.id, 1, at(2))),
            "scheduled_for": "2026-12-02T12:02:00Z",
        },
    ]
    assert _states(schedule) == {
        at(1): ["CANCELED"], at(2): ["SCHEDULED"], at(3): ["SCHEDULED"],
    }  # fmt: skip
    assert _pending(schedule) == {at(2): 1, at(3): 1}


def test_pause_and_resume_again_keep_one_occurrence_per_instant(api_a, tenant_a, materialize):
    schedule = _paused(api_a, tenant_a, materialize)
    _resume(api_a, schedule, NOW + timedelta(seconds=5))

    with time_machine.travel(NOW + timedelta(seconds=10), tick=False):
        second = api_a.post(f"/api/v1/schedules/{schedule.id}/pause").json()["receipt"]
    assert len(second["invalidated"]) == 2
    body = _resume(api_a, schedule, NOW + timedelta(seconds=15))

    assert [r["scheduled_for"] for r in body["receipt"]["restored"]] == [
        "2026-12-02T12:01:00Z", "2026-12-02T12:02:00Z",
    ]  # fmt: skip
    assert _states(schedule) == {at(1): ["SCHEDULED"], at(2): ["SCHEDULED"]}
    assert _pending(schedule) == {at(1): 1, at(2): 1}
    # resuming an active schedule restores nothing
    assert _resume(api_a, schedule, NOW + timedelta(seconds=20))["receipt"]["restored"] == []


def test_resume_does_not_revive_an_occurrence_the_tenant_canceled(api_a, tenant_a, materialize):
    schedule = make_schedule(tenant_a, next_run_at=at(1))
    with time_machine.travel(NOW, tick=False):
        materialize(NOW)
        chosen = occurrence_id_for(schedule.id, 1, at(2))
        occurrence_cancel(
            tenant_id=tenant_a.id, occurrence_id=chosen, now=NOW - timedelta(seconds=1)
        )
        assert api_a.post(f"/api/v1/schedules/{schedule.id}/pause").status_code == 200

    body = _resume(api_a, schedule, NOW + timedelta(seconds=10))

    assert [r["scheduled_for"] for r in body["receipt"]["restored"]] == ["2026-12-02T12:01:00Z"]
    assert _states(schedule) == {at(1): ["SCHEDULED"], at(2): ["CANCELED"]}
    assert _pending(schedule) == {at(1): 1}


def test_resume_after_an_update_while_paused_leaves_the_old_version_canceled(
    api_a, tenant_a, materialize
):
    schedule = _paused(api_a, tenant_a, materialize)
    with time_machine.travel(NOW + timedelta(seconds=5), tick=False):
        patched = api_a.patch(
            f"/api/v1/schedules/{schedule.id}", {"payload": {"v": 2}}, format="json"
        )
    assert patched.status_code == 200, patched.content

    resumed_at = NOW + timedelta(seconds=10)
    body = _resume(api_a, schedule, resumed_at)
    materialize(resumed_at)

    # version 2 produces 12:01 and 12:02 itself; version 1's canceled ones stay canceled
    assert body["receipt"]["restored"] == []
    assert {
        (o.schedule_version, o.scheduled_for): o.state
        for o in Occurrence.objects.filter(schedule=schedule, scheduled_for__lte=at(2))
    } == {
        (1, at(1)): "CANCELED", (1, at(2)): "CANCELED",
        (2, at(1)): "SCHEDULED", (2, at(2)): "SCHEDULED",
    }  # fmt: skip
    assert _pending(schedule) == {at(1): 1, at(2): 1}


def _drain(publisher: Any, prefix: str) -> list[str]:
    received = []
    for name in all_queue_names(prefix, settings.TICK_TENANT_PARTITIONS):
        while (message := publisher._channel.basic_get(name, no_ack=True)) is not None:
            received.append(json.loads(message.body)[1]["occurrence_id"])
    return received


@pytest.mark.parametrize("action", ["pause", "cancel"])
def test_receipt_says_a_published_unrecorded_occurrence_is_dropped_at_claim(
    api_a, tenant_a, queue_prefix, publisher, action
):
    # given: an every-minute schedule whose current-minute instant is due now (real clock);
    # not in the last seconds of a minute, so the next instant is clearly not due yet
    while timezone.now().second >= 55:
        time.sleep(0.5)
    now = timezone.now()
    current = now.replace(second=0, microsecond=0)
    schedule = make_schedule(tenant_a, next_run_at=current, max_lateness_s=120)
    materialize_pass(leases=leases(), now=now, config=materialize_config(window_s=120))
    # and the relay published it, but its recorder has not recorded the confirm yet
    relay_leases = leases(ShardLease.Role.RELAY)
    recorder = Recorder(relay_leases)  # not started: the record is still to come
    step = relay_step(
        leases=relay_leases, publisher=publisher, config=relay_config(queue_prefix),
        recorder=recorder,
    )  # fmt: skip
    assert step.published >= 1
    published = {
        str(o) for o in DispatchOutbox.objects.filter(
            id__in=recorder.inflight_ids()
        ).values_list("occurrence_id", flat=True)
    }  # fmt: skip
    current_id = str(occurrence_id_for(schedule.id, 1, current))
    assert current_id in published
    unpublished = {
        str(o.id) for o in Occurrence.objects.filter(schedule=schedule)
    } - published  # fmt: skip
    assert unpublished  # the next minute(s), not due yet

    # when
    response = api_a.post(f"/api/v1/schedules/{schedule.id}/{action}")

    # then: the published one is named as dropped at claim, not as recalled unpublished
    assert response.status_code == 200, response.content
    receipt = response.json()["receipt"]
    assert set(receipt["dropped_at_claim"]) == published
    assert set(receipt["invalidated"]) == unpublished
    assert receipt["invalidated_state"] == "CANCELED"
    assert receipt["not_recalled"] == []

    # and its message, delivered once, is dropped by the claim: it never runs
    assert _drain(publisher, queue_prefix) == [current_id]
    summary = occurrence_execute(
        occurrence_id=uuid.UUID(current_id), scheduled_for=current, worker_id="w1"
    )
    assert summary == {"status": "duplicate"}
    assert not Attempt.objects.filter(occurrence_id=current_id).exists()
    # the late record confirms the receipt: published (enqueued_at), never run (CANCELED)
    batch = recorder.queue.get_nowait()
    assert batch is not None
    record_confirmed(leases=relay_leases, batch=batch)
    occurrence = Occurrence.objects.get(id=current_id)
    assert occurrence.state == Occurrence.State.CANCELED
    assert occurrence.enqueued_at is not None


def test_the_web_receipt_of_resume_shows_the_restored_instants(
    client, alice, api_a, tenant_a, materialize
):
    schedule = _paused(api_a, tenant_a, materialize)
    client.force_login(alice)

    with time_machine.travel(NOW + timedelta(seconds=10), tick=False):
        resumed = client.post(f"/schedules/{schedule.id}/resume/")

    assert resumed.status_code == 200
    page = resumed.content.decode()
    assert "<strong>2</strong> instants the pause had canceled scheduled again" in page
    restored_id = occurrence_id_for(schedule.id, 1, at(1))
    assert f'<a href="/occurrences/{restored_id}/">2026-12-02 12:01:00 UTC</a>' in page


def test_with_a_span_pause_resume_and_update_recall_every_instant_written_ahead(api_a, tenant_a):
    # given: an every-minute schedule of shard 0 written a span ahead at 12:00:30 (window
    # 120 s, span 240 s: 12:01 to 12:04, next_run_at 12:05)
    schedule = make_schedule(tenant_a, next_run_at=at(1))
    Schedule.objects.filter(id=schedule.id).update(shard=0)
    held = leases()
    config = materialize_config(window_s=120, span_s=240)
    ids = [str(occurrence_id_for(schedule.id, 1, at(m))) for m in (1, 2, 3, 4)]
    with time_machine.travel(NOW, tick=False):
        materialize_pass(leases=held, now=NOW, config=config)
        assert _pending(schedule) == {at(m): 1 for m in (1, 2, 3, 4)}

        # when: paused
        paused = api_a.post(f"/api/v1/schedules/{schedule.id}/pause").json()["receipt"]

    # then: all four are canceled, nothing is left to publish
    assert paused["invalidated"] == ids
    assert _pending(schedule) == {}

    # when: resumed at 12:00:40, then its payload changed at 12:00:45
    body = _resume(api_a, schedule, NOW + timedelta(seconds=10))
    assert [r["id"] for r in body["receipt"]["restored"]] == ids
    with time_machine.travel(NOW + timedelta(seconds=15), tick=False):
        patched = api_a.patch(
            f"/api/v1/schedules/{schedule.id}", {"payload": {"v": 2}}, format="json"
        )
    assert patched.status_code == 200, patched.content
    assert patched.json()["receipt"]["invalidated"] == ids

    # then: version 2 writes the same instants itself and version 1 publishes none of them
    with time_machine.travel(NOW + timedelta(seconds=20), tick=False):
        materialize_pass(leases=held, now=NOW + timedelta(seconds=20), config=config)
    assert {
        (row.schedule_version, row.scheduled_for)
        for row in DispatchOutbox.objects.filter(schedule_id=schedule.id)
    } == {(2, at(m)) for m in (1, 2, 3, 4)}
    states = {t: sorted(found) for t, found in _states(schedule).items()}
    assert states == {at(m): ["SCHEDULED", "SUPERSEDED"] for m in (1, 2, 3, 4)}
