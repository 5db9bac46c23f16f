"""An update commits a boundary: every instant of the old version before it is stored (or
counted) MISSED when the materializer was behind, every instant after it belongs to the new
version, and the reconciliation audit finds nothing missing (docs/decisions.md, "Lifecycle
API")."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
import time_machine
from django.db import connection

from apps.occurrences.audit.reconcile import FAILING, ReconcileReport, reconcile
from apps.occurrences.models import DispatchOutbox, Occurrence, occurrence_id_for
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


@pytest.mark.parametrize(
    ("policy", "catchup_limit"),
    [
        (Schedule.MisfirePolicy.SKIP, 0),
        (Schedule.MisfirePolicy.FIRE_ONCE, 0),
        (Schedule.MisfirePolicy.CATCHUP, 3),
    ],
)
def test_update_during_materializer_outage_records_each_old_instant(
    tenant_a: Tenant, policy: Schedule.MisfirePolicy, catchup_limit: int
) -> None:
    partitions_ensure({DAY.date()})
    with time_machine.travel(DAY + timedelta(hours=12, seconds=30), tick=False):
        schedule = make_schedule(
            tenant_a, name="report", misfire_policy=policy, catchup_limit=catchup_limit
        )
    assert schedule.next_run_at == DAY + timedelta(hours=12, minutes=1)  # never materialized

    updated = _update_at(schedule, UPDATE_AT)

    old_instants = [DAY + timedelta(hours=12, minutes=m) for m in range(1, 6)]
    assert _old_rows(schedule) == dict.fromkeys(old_instants, Occurrence.State.MISSED)
    stored = Occurrence.objects.filter(schedule_id=schedule.pk, schedule_version=1)
    assert sorted(stored.values_list("id", flat=True)) == sorted(
        occurrence_id_for(schedule.pk, 1, t) for t in old_instants
    )
    # No old instant is fired, whatever the policy: the claim would drop it as SUPERSEDED.
    assert not DispatchOutbox.objects.filter(schedule_id=schedule.pk).exists()
    detail = _missed_event(schedule)
    assert detail["missed_count"] == 5 and detail["count_exact"] is True
    assert detail["boundary"] == UPDATE_AT.isoformat()
    update_event = ScheduleEvent.objects.get(
        schedule_id=schedule.pk, kind=ScheduleEvent.Kind.UPDATED
    )
    assert update_event.detail["missed"] == 5
    # Every instant after the boundary belongs to the new version, from the next one on.
    assert updated.version == 2
    assert updated.next_run_at == DAY + timedelta(hours=12, minutes=6)

    report = _audit(DAY + timedelta(hours=11), DAY + timedelta(hours=13))

    assert _failing(report) == {}, report.as_json()
    assert report.counts["missed"] == 5
    assert report.counts["beyond_frontier"] == 27  # 12:06 … 12:58, every two minutes


def test_long_outage_records_the_latest_and_summarises_the_rest(tenant_a: Tenant) -> None:
    partitions_ensure({DAY.date()})
    with time_machine.travel(DAY + timedelta(hours=10, seconds=30), tick=False):
        schedule = make_schedule(tenant_a, name="report")

    _update_at(schedule, UPDATE_AT)

    # 10:01 … 12:05 is 125 instants: the latest ten are rows, the rest counted.
    rows = _old_rows(schedule)
    assert sorted(rows) == [DAY + timedelta(hours=11, minutes=56 + m) for m in range(10)]
    assert set(rows.values()) == {Occurrence.State.MISSED}
    detail = _missed_event(schedule)
    assert detail["count_exact"] is False
    assert detail["first_pending"] == (DAY + timedelta(hours=10, minutes=1)).isoformat()

    report = _audit(DAY + timedelta(hours=9), DAY + timedelta(hours=13))

    assert _failing(report) == {}, report.as_json()
    assert report.counts["missed"] == 10
    assert report.counts["missed_summarised"] == 115


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

    assert sorted(_old_rows(schedule)) == [
        first + timedelta(days=n, hours=12) for n in range(5, 10)
    ]
    detail = _missed_event(schedule)
    assert detail["missed_count"] == 10 and detail["count_exact"] is False

    report = _audit(first, DAY + timedelta(days=1))

    assert _failing(report) == {}, report.as_json()
    assert report.counts["missed"] == 5
    assert report.counts["missed_summarised"] == 5


def _one_shot(tenant: Tenant, run_at: datetime) -> Schedule:
    with time_machine.travel(run_at - timedelta(minutes=1), tick=False):
        return make_schedule(tenant, name="report", kind=Schedule.Kind.ONE_SHOT, expression="",
                             run_at=run_at)  # fmt: skip


def test_moved_one_shot_records_its_old_instant_missed(tenant_a: Tenant) -> None:
    partitions_ensure({DAY.date()})
    old_run = DAY + timedelta(hours=12, minutes=2)
    schedule = _one_shot(tenant_a, old_run)

    updated = _update_at(
        schedule, UPDATE_AT, kind=Schedule.Kind.ONE_SHOT, expression="",
        run_at=DAY + timedelta(hours=13),
    )  # fmt: skip

    assert _old_rows(schedule) == {old_run: Occurrence.State.MISSED}
    assert _missed_event(schedule)["missed_count"] == 1
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
