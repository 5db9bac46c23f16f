"""An update commits a boundary: every instant of the old version before it that the
materializer had not reached is produced as a batch would have (late ones per the misfire
policy) or stored (or counted) MISSED, every instant after it belongs to the new version, and
the reconciliation audit finds nothing missing (docs/decisions.md, "Lifecycle API")."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
import time_machine
from django.db import connection

from apps.occurrences.audit.reconcile import FAILING, ReconcileReport, reconcile
from apps.occurrences.execution.run import occurrence_execute
from apps.occurrences.models import DispatchOutbox, Lane, Occurrence, occurrence_id_for
from apps.occurrences.pipeline.partitions import partition_name, partitions_ensure
from apps.occurrences.schedule_changes import schedule_update
from apps.schedules.models import Schedule, ScheduleEvent
from apps.schedules.services import ScheduleSpec
from apps.schedules.tests.factories import make_schedule
from apps.tenants.models import Tenant

pytestmark = pytest.mark.django_db

DAY = datetime(2031, 2, 10, tzinfo=UTC)
# The update: 12:05:30. The materializer last ran before 12:01, so 12:01 … 12:05 are the old
# version's instants that nothing materialized.
UPDATE_AT = DAY + timedelta(hours=12, minutes=5, seconds=30)


def _spec(**overrides: Any) -> ScheduleSpec:
    fields: dict[str, Any] = {
        "name": "report",
        "kind": Schedule.Kind.CRON,
        "expression": "*/2 * * * *",
        "time_zone": "UTC",
        "handler": "record",
    }
    fields.update(overrides)
    return ScheduleSpec(**fields)


def _update_at(schedule: Schedule, at: datetime, **overrides: Any) -> Schedule:
    with time_machine.travel(at, tick=False):
        result = schedule_update(
            schedule=Schedule.objects.get(pk=schedule.pk), spec=_spec(**overrides), actor="test"
        )
    return result.schedule


def _audit(start: datetime, end: datetime) -> ReconcileReport:
    return reconcile(start=start, end=end, now=UPDATE_AT)


def _failing(report: ReconcileReport) -> dict[str, int]:
    return {kind: report.counts[kind] for kind in FAILING if report.counts[kind]}


def _old_rows(schedule: Schedule) -> dict[datetime, str]:
    rows = Occurrence.objects.filter(schedule_id=schedule.pk, schedule_version=1)
    return dict(rows.values_list("scheduled_for", "state"))


def _missed_event(schedule: Schedule) -> dict[str, Any]:
    events = ScheduleEvent.objects.filter(schedule_id=schedule.pk, kind=ScheduleEvent.Kind.MISSED)
    assert events.count() == 1
    event = events.get()
    assert event.version == 1
    return dict(event.detail)


def _at(minute: int) -> datetime:
    return DAY + timedelta(hours=12, minutes=minute)


# 12:01 … 12:05 never materialized, the update at 12:05:30: 12:05 is within max_lateness_s
# (60 s) and fires on time; older ones are late and the misfire policy decides.
@pytest.mark.parametrize(
    ("policy", "catchup_limit", "fired", "missed"),
    [
        (Schedule.MisfirePolicy.SKIP, 0, {5: Lane.STRICT}, [1, 2, 3, 4]),
        (Schedule.MisfirePolicy.FIRE_ONCE, 0, {4: Lane.CATCHUP, 5: Lane.STRICT}, [1, 2, 3]),
        (
            Schedule.MisfirePolicy.CATCHUP, 3,
            {2: Lane.CATCHUP, 3: Lane.CATCHUP, 4: Lane.CATCHUP, 5: Lane.STRICT}, [1],
        ),
    ],
)  # fmt: skip
def test_update_during_materializer_outage_produces_each_old_instant_per_policy(
    tenant_a: Tenant,
    policy: Schedule.MisfirePolicy,
    catchup_limit: int,
    fired: dict[int, Lane],
    missed: list[int],
) -> None:
    partitions_ensure({DAY.date()})
    with time_machine.travel(DAY + timedelta(hours=12, seconds=30), tick=False):
        schedule = make_schedule(
            tenant_a, name="report", misfire_policy=policy, catchup_limit=catchup_limit
        )
    assert schedule.next_run_at == _at(1)  # never materialized

    updated = _update_at(schedule, UPDATE_AT)

    assert _old_rows(schedule) == {
        **{_at(m): Occurrence.State.SCHEDULED for m in fired},
        **{_at(m): Occurrence.State.MISSED for m in missed},
    }
    stored = Occurrence.objects.filter(schedule_id=schedule.pk, schedule_version=1)
    assert sorted(stored.values_list("id", flat=True)) == sorted(
        occurrence_id_for(schedule.pk, 1, _at(m)) for m in range(1, 6)
    )
    assert dict(stored.filter(state=Occurrence.State.SCHEDULED).values_list(
        "scheduled_for", "lane"
    )) == {_at(m): lane for m, lane in fired.items()}  # fmt: skip
    # The fired ones are published like any occurrence, as the old version's.
    outbox = DispatchOutbox.objects.filter(schedule_id=schedule.pk)
    assert sorted(outbox.values_list("scheduled_for", "schedule_version")) == [
        (_at(m), 1) for m in sorted(fired)
    ]
    detail = _missed_event(schedule)
    assert detail["missed_count"] == len(missed) and detail["count_exact"] is True
    assert detail["boundary"] == UPDATE_AT.isoformat()
    update_event = ScheduleEvent.objects.get(
        schedule_id=schedule.pk, kind=ScheduleEvent.Kind.UPDATED
    )
    assert update_event.detail["missed"] == len(missed)
    # Every instant after the boundary belongs to the new version, from the next one on.
    assert updated.version == 2
    assert updated.next_run_at == _at(6)

    report = _audit(DAY + timedelta(hours=11), DAY + timedelta(hours=13))

    assert _failing(report) == {}, report.as_json()
    assert report.counts["missed"] == len(missed)
    assert report.counts["pending"] == len(fired)
    assert report.counts["beyond_frontier"] == 27  # 12:06 … 12:58, every two minutes


def test_a_fired_old_instant_runs_after_the_update(tenant_a: Tenant) -> None:
    # given: an update made while the materializer was behind fired the old version's 12:05
    partitions_ensure({DAY.date()})
    with time_machine.travel(DAY + timedelta(hours=12, seconds=30), tick=False):
        schedule = make_schedule(
            tenant_a, name="report", misfire_policy=Schedule.MisfirePolicy.SKIP
        )
    _update_at(schedule, UPDATE_AT)
    fired = Occurrence.objects.get(schedule_id=schedule.pk, scheduled_for=_at(5))

    # when: its message reaches a worker
    with time_machine.travel(UPDATE_AT + timedelta(seconds=1), tick=False):
        summary = occurrence_execute(
            occurrence_id=fired.id, scheduled_for=fired.scheduled_for, worker_id="w1"
        )

    # then: it runs, as the old version's occurrence, once
    fired.refresh_from_db()
    assert summary["status"] == Occurrence.State.SUCCEEDED
    assert fired.state == Occurrence.State.SUCCEEDED and fired.schedule_version == 1


def test_long_outage_records_the_latest_and_summarises_the_rest(tenant_a: Tenant) -> None:
    partitions_ensure({DAY.date()})
    with time_machine.travel(DAY + timedelta(hours=10, seconds=30), tick=False):
        schedule = make_schedule(tenant_a, name="report")

    _update_at(schedule, UPDATE_AT)

    # 10:01 … 12:05 is 125 instants (FIRE_ONCE, the default): 12:05 fires on time, the
    # latest late one (12:04) fires once, the ten before it are rows, the rest counted.
    rows = _old_rows(schedule)
    assert rows == {
        **{DAY + timedelta(hours=11, minutes=54 + m): Occurrence.State.MISSED for m in range(10)},
        _at(4): Occurrence.State.SCHEDULED,
        _at(5): Occurrence.State.SCHEDULED,
    }
    detail = _missed_event(schedule)
    assert detail["count_exact"] is False
    assert detail["first_pending"] == (DAY + timedelta(hours=10, minutes=1)).isoformat()

    report = _audit(DAY + timedelta(hours=9), DAY + timedelta(hours=13))

    assert _failing(report) == {}, report.as_json()
    assert report.counts["missed"] == 10
    assert report.counts["missed_summarised"] == 113
    assert report.counts["pending"] == 2


def _has_partition(day: date) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT to_regclass(%s) IS NOT NULL", [partition_name("occurrences_occurrence", day)]
        )
        row = cursor.fetchone()
    return bool(row and row[0])


def test_instants_on_days_without_a_partition_are_counted_not_stored(tenant_a: Tenant) -> None:
    first = DAY - timedelta(days=9)  # a daily rule, down for ten days
    assert not any(_has_partition((first + timedelta(days=n)).date()) for n in range(5))
    partitions_ensure((first + timedelta(days=n)).date() for n in range(5, 10))
    with time_machine.travel(first + timedelta(hours=11), tick=False):
        schedule = make_schedule(tenant_a, name="report", expression="0 12 * * *")

    _update_at(schedule, UPDATE_AT, expression="0 13 * * *")

    # FIRE_ONCE: the latest (DAY 12:00) fires; of the nine missed, four have a partition.
    assert _old_rows(schedule) == {
        **{first + timedelta(days=n, hours=12): Occurrence.State.MISSED for n in range(5, 9)},
        DAY + timedelta(hours=12): Occurrence.State.SCHEDULED,
    }
    detail = _missed_event(schedule)
    assert detail["missed_count"] == 9 and detail["count_exact"] is False
    # The relay publishes the fired one (due 5 min ago, so the audit would call it stuck).
    fired = Occurrence.objects.filter(schedule_id=schedule.pk, state=Occurrence.State.SCHEDULED)
    assert DispatchOutbox.objects.filter(schedule_id=schedule.pk).delete()[0] == 1
    fired.update(state=Occurrence.State.ENQUEUED, enqueued_at=UPDATE_AT)

    report = _audit(first, DAY + timedelta(days=1))

    assert _failing(report) == {}, report.as_json()
    assert report.counts["missed"] == 4
    assert report.counts["missed_summarised"] == 5
    assert report.counts["pending"] == 1  # ENQUEUED: not finished yet


def _one_shot(tenant: Tenant, run_at: datetime, **fields: Any) -> Schedule:
    with time_machine.travel(run_at - timedelta(minutes=1), tick=False):
        return make_schedule(tenant, name="report", kind=Schedule.Kind.ONE_SHOT, expression="",
                             run_at=run_at, **fields)  # fmt: skip


@pytest.mark.parametrize(
    ("policy", "old_state", "missed_events"),
    [
        (Schedule.MisfirePolicy.SKIP, Occurrence.State.MISSED, 1),
        (Schedule.MisfirePolicy.FIRE_ONCE, Occurrence.State.SCHEDULED, 0),
    ],
)
def test_moved_one_shot_settles_its_late_old_instant_per_policy(
    tenant_a: Tenant, policy: Schedule.MisfirePolicy, old_state: str, missed_events: int
) -> None:
    partitions_ensure({DAY.date()})
    old_run = DAY + timedelta(hours=12, minutes=2)
    schedule = _one_shot(tenant_a, old_run, misfire_policy=policy)

    updated = _update_at(
        schedule, UPDATE_AT, kind=Schedule.Kind.ONE_SHOT, expression="",
        run_at=DAY + timedelta(hours=13),
    )  # fmt: skip

    assert _old_rows(schedule) == {old_run: old_state}
    missed = ScheduleEvent.objects.filter(schedule_id=schedule.pk, kind=ScheduleEvent.Kind.MISSED)
    assert missed.count() == missed_events
    assert updated.next_run_at == DAY + timedelta(hours=13)
    report = _audit(DAY + timedelta(hours=11), DAY + timedelta(hours=14))
    assert _failing(report) == {}, report.as_json()


def test_one_shot_kept_late_by_the_new_version_is_not_recorded_missed(tenant_a: Tenant) -> None:
    partitions_ensure({DAY.date()})
    run_at = DAY + timedelta(hours=12, minutes=2)
    schedule = _one_shot(tenant_a, run_at)

    updated = _update_at(
        schedule, UPDATE_AT, kind=Schedule.Kind.ONE_SHOT, expression="", run_at=run_at,
        payload={"changed": True},
    )  # fmt: skip

    # The new version still fires the late instant (decisions.md): the old one owes nothing.
    assert updated.next_run_at == run_at
    assert _old_rows(schedule) == {}
    update_event = ScheduleEvent.objects.get(
        schedule_id=schedule.pk, kind=ScheduleEvent.Kind.UPDATED
    )
    assert update_event.detail["missed"] == 0
    assert not ScheduleEvent.objects.filter(
        schedule_id=schedule.pk, kind=ScheduleEvent.Kind.MISSED
    ).exists()
