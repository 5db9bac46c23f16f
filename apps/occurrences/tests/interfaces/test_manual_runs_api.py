"""Run now and backfill through the API: deterministic ids, overlap, quotas of the range,
receipts, the schedule's history, tenancy and validation."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.occurrences.execution.claim import ClaimStatus, occurrence_claim
from apps.occurrences.manual_runs import backfill_occurrence_id, run_now_occurrence_id
from apps.occurrences.models import DispatchOutbox, Lane, Occurrence
from apps.occurrences.tests.support import rows
from apps.schedules.models import Schedule, ScheduleEvent

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.usefixtures("partitions_around_today"),
    pytest.mark.clock_edge,
]


def _run(api: Any, schedule: Schedule, body: Any = None, **headers: str) -> Any:
    return api.post(f"/api/v1/schedules/{schedule.id}/run", body or {}, format="json", **headers)


def _backfill(api: Any, schedule: Schedule, start: datetime, end: datetime, **extra: Any) -> Any:
    body = {"from": start.isoformat(), "to": end.isoformat(), **extra}
    return api.post(f"/api/v1/schedules/{schedule.id}/backfill", body, format="json")


def _hour(hours_ago: int) -> datetime:
    top = timezone.now().astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return top - timedelta(hours=hours_ago)


# ---------------------------------------------------------------------------------- run now


def test_run_now_is_rate_limited_per_schedule(api_a, tenant_a, settings):
    settings.TICK_RUN_NOW_PER_MIN = 3
    busy, other = rows.schedule(tenant_a), rows.schedule(tenant_a)

    codes = [_run(api_a, busy, {"request_id": f"r{n}"}).status_code for n in range(3)]
    refused = _run(api_a, busy, {"request_id": "r3"})
    replay = _run(api_a, busy, {"request_id": "r0"})  # an earlier request, answered again
    elsewhere = _run(api_a, other, {"request_id": "r3"})

    assert codes == [202, 202, 202]
    assert refused.status_code == 429, refused.content
    assert refused.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(refused["Retry-After"]) <= 61
    assert (replay.status_code, replay.json()["receipt"]["replayed"]) == (202, True)
    assert elsewhere.status_code == 202
    manual = Occurrence.objects.filter(schedule=busy, origin=Occurrence.Origin.MANUAL)
    assert manual.count() == 3


def test_run_now_twice_with_the_same_request_id_creates_one_occurrence(api_a, tenant_a):
    schedule = rows.schedule(tenant_a)

    first = _run(api_a, schedule, HTTP_IDEMPOTENCY_KEY="deploy-42")
    again = _run(api_a, schedule, {"request_id": "deploy-42"})

    assert first.status_code == 202, first.content
    assert again.status_code == 202, again.content
    receipt = first.json()["receipt"]
    expected_id = str(run_now_occurrence_id(schedule.id, "deploy-42"))
    assert receipt["occurrence"] == expected_id
    assert (receipt["state"], receipt["lane"], receipt["replayed"]) == (
        "SCHEDULED",
        "strict",
        False,
    )
    assert again.json()["receipt"]["occurrence"] == expected_id
    assert again.json()["receipt"]["replayed"] is True
    assert again.headers["Idempotent-Replayed"] == "true"
    manual = Occurrence.objects.filter(schedule=schedule, origin=Occurrence.Origin.MANUAL)
    assert [(str(o.id), o.lane) for o in manual] == [(expected_id, Lane.STRICT)]
    assert manual[0].requested_by.startswith("api-key:")
    assert DispatchOutbox.objects.filter(occurrence_id=expected_id).count() == 1
    events = ScheduleEvent.objects.filter(schedule=schedule, kind=ScheduleEvent.Kind.RUN_NOW)
    assert [(e.actor, e.detail["occurrence"], e.detail["request_id"]) for e in events] == [
        (manual[0].requested_by, expected_id, "deploy-42")
    ]


def test_run_now_without_a_request_id_runs_each_time(api_a, tenant_a):
    schedule = rows.schedule(tenant_a)

    ids = {_run(api_a, schedule).json()["receipt"]["occurrence"] for _ in range(2)}

    assert len(ids) == 2
    assert Occurrence.objects.filter(schedule=schedule, origin="manual").count() == 2


def test_run_now_under_skip_if_running_while_running_is_skipped_with_a_reason(api_a, tenant_a):
    schedule = rows.schedule(tenant_a, overlap_policy=Schedule.OverlapPolicy.SKIP_IF_RUNNING)
    rows.occurrence(schedule, _hour(0), state=Occurrence.State.RUNNING)

    response = _run(api_a, schedule, {"request_id": "r1"})

    assert response.status_code == 202, response.content
    receipt = response.json()["receipt"]
    assert receipt["state"] == "SKIPPED_OVERLAP"
    assert "running" in receipt["reason"] and "skip_if_running" in receipt["reason"]
    occ = Occurrence.objects.get(id=receipt["occurrence"])
    assert occ.state == Occurrence.State.SKIPPED_OVERLAP and occ.finished_at is not None
    assert not DispatchOutbox.objects.filter(occurrence_id=occ.id).exists()
    event = ScheduleEvent.objects.get(schedule=schedule, kind=ScheduleEvent.Kind.RUN_NOW)
    assert (
        event.detail["state"] == "SKIPPED_OVERLAP" and event.detail["reason"] == receipt["reason"]
    )
    # The replay tells the same reason.
    assert (
        _run(api_a, schedule, {"request_id": "r1"}).json()["receipt"]["reason"] == receipt["reason"]
    )


def test_run_now_under_skip_if_running_runs_when_nothing_runs(api_a, tenant_a):
    schedule = rows.schedule(tenant_a, overlap_policy=Schedule.OverlapPolicy.SKIP_IF_RUNNING)
    rows.occurrence(schedule, _hour(1), state=Occurrence.State.SUCCEEDED)

    receipt = _run(api_a, schedule).json()["receipt"]

    assert (receipt["state"], receipt["reason"]) == ("SCHEDULED", "")


def test_run_now_of_a_paused_schedule_runs_and_of_a_canceled_one_is_409(api_a, tenant_a):
    paused = rows.schedule(tenant_a)
    assert api_a.post(f"/api/v1/schedules/{paused.id}/pause").status_code == 200
    canceled = rows.schedule(tenant_a)
    assert api_a.post(f"/api/v1/schedules/{canceled.id}/cancel").status_code == 200

    ran = _run(api_a, paused)
    refused = _run(api_a, canceled)

    assert ran.status_code == 202 and ran.json()["schedule"]["state"] == "PAUSED"
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "state_conflict"
    assert not Occurrence.objects.filter(schedule=canceled).exists()


def test_run_now_validates_its_body(api_a, tenant_a):
    schedule = rows.schedule(tenant_a)

    unknown = _run(api_a, schedule, {"payload": {"x": 1}})
    mismatch = _run(api_a, schedule, {"request_id": "a"}, HTTP_IDEMPOTENCY_KEY="b")
    not_text = _run(api_a, schedule, {"request_id": 7})

    assert unknown.status_code == 400 and unknown.json()["error"]["fields"] == {
        "payload": ["Unknown field."]
    }
    assert mismatch.status_code == 400 and "request_id" in mismatch.json()["error"]["fields"]
    assert not_text.status_code == 400 and "request_id" in not_text.json()["error"]["fields"]
    assert not Occurrence.objects.filter(schedule=schedule).exists()


# --------------------------------------------------------------------------------- backfill


def _history(schedule: Schedule) -> list[datetime]:
    """An hourly schedule's last five hours: succeeded, missed, nothing, dead, skipped."""
    rows.occurrence(schedule, _hour(5), state=Occurrence.State.SUCCEEDED)
    rows.occurrence(schedule, _hour(4), state=Occurrence.State.MISSED)
    rows.occurrence(schedule, _hour(2), state=Occurrence.State.DEAD)
    rows.occurrence(schedule, _hour(1), state=Occurrence.State.SKIPPED_OVERLAP)
    return [_hour(4), _hour(3), _hour(1)]


def test_backfill_runs_exactly_the_missed_instants_and_again_runs_none(api_a, tenant_a):
    schedule = rows.schedule(tenant_a)
    missed = _history(schedule)

    first = _backfill(api_a, schedule, _hour(5), _hour(0), only="missed")
    again = _backfill(api_a, schedule, _hour(5), _hour(0), only="missed")

    assert first.status_code == 202, first.content
    receipt = first.json()["receipt"]
    assert (receipt["instants"], receipt["queued"], receipt["already_done"]) == (5, 3, 0)
    assert receipt["skipped"] == {"succeeded": 1, "failed": 1}
    assert receipt["lane"] == "catchup" and receipt["only"] == "missed"
    expected = [str(backfill_occurrence_id(schedule.id, at)) for at in missed]
    assert receipt["occurrences"] == expected
    backfilled = Occurrence.objects.filter(schedule=schedule, origin="backfill")
    assert sorted(o.scheduled_for for o in backfilled) == missed
    assert {(o.state, o.lane) for o in backfilled} == {("SCHEDULED", "catchup")}
    outbox = DispatchOutbox.objects.filter(occurrence_id__in=expected)
    assert sorted(r.scheduled_for for r in outbox) == missed
    assert {r.lane for r in outbox} == {Lane.CATCHUP}
    # and: the same range again queues nothing
    assert again.status_code == 202
    receipt = again.json()["receipt"]
    assert (receipt["queued"], receipt["already_done"], receipt["occurrences"]) == (0, 3, [])
    assert (
        backfilled.count() == 3
        and DispatchOutbox.objects.filter(occurrence_id__in=expected).count() == 3
    )
    events = ScheduleEvent.objects.filter(schedule=schedule, kind=ScheduleEvent.Kind.BACKFILLED)
    assert [(e.detail["queued"], e.detail["already_done"]) for e in events.order_by("id")] == [
        (3, 0), (0, 3)
    ]  # fmt: skip


def test_backfill_failed_runs_the_dead_instant_and_all_skips_what_is_in_flight(api_a, tenant_a):
    schedule = rows.schedule(tenant_a)
    _history(schedule)
    rows.occurrence(schedule, _hour(6), state=Occurrence.State.RETRY_WAIT)

    failed = _backfill(api_a, schedule, _hour(5), _hour(0), only="FAILED").json()["receipt"]
    every = _backfill(api_a, schedule, _hour(6), _hour(0), only="all").json()["receipt"]

    assert (failed["queued"], failed["first"]) == (1, _hour(2).isoformat().replace("+00:00", "Z"))
    # all: the four not yet backfilled of the six, not the one waiting for its retry
    assert (every["queued"], every["already_done"], every["skipped"]) == (4, 1, {"in_flight": 1})


def test_backfill_dry_run_previews_without_writing(api_a, tenant_a):
    schedule = rows.schedule(tenant_a)
    missed = _history(schedule)

    response = _backfill(api_a, schedule, _hour(5), _hour(0), dry_run=True)

    assert response.status_code == 200, response.content
    receipt = response.json()["receipt"]
    assert (receipt["dry_run"], receipt["queued"]) == (True, 3)
    assert receipt["first"] == missed[0].isoformat().replace("+00:00", "Z")
    assert receipt["last"] == missed[-1].isoformat().replace("+00:00", "Z")
    assert not Occurrence.objects.filter(schedule=schedule, origin="backfill").exists()
    assert not ScheduleEvent.objects.filter(schedule=schedule, kind="backfilled").exists()


def test_backfill_over_the_maximum_is_a_400_naming_it(api_a, tenant_a, settings):
    settings.TICK_BACKFILL_MAX_INSTANTS = 4
    schedule = rows.schedule(tenant_a)

    response = _backfill(api_a, schedule, _hour(5), _hour(0))

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "backfill_too_large"
    assert "at most 4" in error["message"] and "to" in error["fields"]
    assert not Occurrence.objects.filter(schedule=schedule).exists()


def test_backfill_validates_the_range_with_every_error_at_once(api_a, tenant_a):
    schedule = rows.schedule(tenant_a)
    future = timezone.now() + timedelta(hours=1)
    too_old = timezone.now() - timedelta(days=400)

    bad = _backfill(api_a, schedule, too_old, future, only="some")
    reversed_range = _backfill(api_a, schedule, _hour(1), _hour(2))
    naive = api_a.post(f"/api/v1/schedules/{schedule.id}/backfill",
                       {"from": "2026-12-01T10:00:00", "to": _hour(1).isoformat(), "x": 1},
                       format="json")  # fmt: skip

    assert bad.status_code == 400 and set(bad.json()["error"]["fields"]) == {"only"}
    assert reversed_range.status_code == 400
    assert reversed_range.json()["error"]["fields"] == {"to": ["Must be after from."]}
    assert naive.status_code == 400 and naive.json()["error"]["fields"] == {"x": ["Unknown field."]}
    future_only = _backfill(api_a, schedule, too_old, future)
    assert set(future_only.json()["error"]["fields"]) == {"from", "to"}


def test_backfill_of_a_canceled_schedule_is_409(api_a, tenant_a):
    schedule = rows.schedule(tenant_a)
    assert api_a.post(f"/api/v1/schedules/{schedule.id}/cancel").status_code == 200

    response = _backfill(api_a, schedule, _hour(3), _hour(0))

    assert response.status_code == 409 and response.json()["error"]["code"] == "state_conflict"


def test_backfill_leaves_instants_the_materializer_has_not_decided(api_a, tenant_a):
    # A paused schedule's frontier stays where the pause left it: later instants are decided
    # by the misfire policy at resume, never doubled by a backfill.
    schedule = rows.schedule(tenant_a, next_run_at=_hour(2))

    receipt = _backfill(api_a, schedule, _hour(4), _hour(0)).json()["receipt"]

    assert (receipt["queued"], receipt["skipped"]) == (2, {"not_materialized": 2})


def test_another_tenants_schedule_is_404_and_nothing_changes(api_b, tenant_a):
    schedule = rows.schedule(tenant_a)

    run = _run(api_b, schedule)
    backfill = _backfill(api_b, schedule, _hour(3), _hour(0))
    unknown = api_b.post(f"/api/v1/schedules/{uuid.uuid4()}/run", {}, format="json")

    assert (run.status_code, backfill.status_code, unknown.status_code) == (404, 404, 404)
    assert run.json()["error"]["code"] == "not_found"
    assert not Occurrence.objects.filter(schedule=schedule).exists()
    assert not ScheduleEvent.objects.filter(schedule=schedule).exclude(kind="created").exists()


# ----------------------------------------------------------------------------- at the claim


def test_a_backfilled_instant_is_delayed_not_skipped_behind_a_running_one(api_a, tenant_a):
    schedule = rows.schedule(tenant_a, overlap_policy=Schedule.OverlapPolicy.SKIP_IF_RUNNING)
    rows.occurrence(schedule, _hour(3), state=Occurrence.State.MISSED)
    receipt = _backfill(api_a, schedule, _hour(3), _hour(2)).json()["receipt"]
    rows.occurrence(schedule, _hour(0), state=Occurrence.State.RUNNING)
    backfilled = Occurrence.objects.get(id=receipt["occurrences"][0])

    claim = occurrence_claim(
        occurrence_id=backfilled.id, scheduled_for=backfilled.scheduled_for, worker_id="w"
    )

    assert claim.status == ClaimStatus.DELAYED
    assert rows.state_of(backfilled) == Occurrence.State.SCHEDULED


def test_a_run_now_that_meets_a_running_one_at_claim_is_skipped(api_a, tenant_a):
    schedule = rows.schedule(tenant_a, overlap_policy=Schedule.OverlapPolicy.SKIP_IF_RUNNING)
    receipt = _run(api_a, schedule).json()["receipt"]
    rows.occurrence(schedule, _hour(0), state=Occurrence.State.RUNNING)
    manual = Occurrence.objects.get(id=receipt["occurrence"])

    claim = occurrence_claim(
        occurrence_id=manual.id, scheduled_for=manual.scheduled_for, worker_id="w"
    )

    assert claim.status == ClaimStatus.SKIPPED_OVERLAP
    assert rows.state_of(manual) == Occurrence.State.SKIPPED_OVERLAP
