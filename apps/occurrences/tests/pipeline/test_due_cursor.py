"""The due cursor `schedules_due` (docs/decisions.md "The due cursor"): the materializer finds a
schedule only while it is ACTIVE with an instant left, at its current `next_run_at`, whatever
path changed it; and an advance no longer rewrites the schedule row's index entries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from apps.occurrences.models import Occurrence
from apps.occurrences.pipeline.materializer import materialize_pass
from apps.occurrences.schedule_changes import (
    schedule_cancel,
    schedule_pause,
    schedule_resume,
    schedule_update,
)
from apps.occurrences.tests.support.pipeline import leases, materialize_config
from apps.schedules.models import Schedule
from apps.schedules.services import ScheduleSpec
from apps.schedules.tests.factories import make_schedule

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 2, 12, 0, 30, tzinfo=UTC)


def _cursor(schedule: Schedule) -> list[tuple[int, datetime]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT shard, next_run_at FROM schedules_due WHERE schedule_id = %s", [schedule.id]
        )
        return list(cursor.fetchall())


def _hot_updates() -> int:
    """HOT updates of schedules_schedule in this transaction so far."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_get_xact_tuples_hot_updated('schedules_schedule'::regclass)")
        return int(cursor.fetchone()[0])


def test_a_created_schedule_is_due_at_its_first_instant(tenant_a):
    schedule = make_schedule(tenant_a)

    assert _cursor(schedule) == [(schedule.shard, schedule.next_run_at)]


def test_the_materializer_moves_the_cursor_with_next_run_at_in_a_hot_update(tenant_a):
    schedule = make_schedule(tenant_a, next_run_at=datetime(2026, 12, 2, 12, 1, tzinfo=UTC))
    hot_before = _hot_updates()

    materialize_pass(leases=leases(), now=NOW, config=materialize_config())

    schedule.refresh_from_db()
    assert schedule.next_run_at == datetime(2026, 12, 2, 12, 3, tzinfo=UTC)
    assert _cursor(schedule) == [(schedule.shard, schedule.next_run_at)]
    assert _hot_updates() == hot_before + 1


def test_a_second_pass_finds_nothing_more_to_do(tenant_a):
    make_schedule(tenant_a, next_run_at=datetime(2026, 12, 2, 12, 1, tzinfo=UTC))
    materialize_pass(leases=leases(), now=NOW, config=materialize_config())

    again = materialize_pass(leases=leases(), now=NOW, config=materialize_config())

    assert again.schedules == 0
    assert Occurrence.objects.count() == 2


def test_pause_hides_the_schedule_and_resume_brings_it_back_where_it_was(tenant_a):
    schedule = make_schedule(tenant_a, next_run_at=datetime(2026, 12, 2, 12, 1, tzinfo=UTC))

    schedule_pause(schedule=schedule, actor="test")
    paused = _cursor(schedule)
    passed = materialize_pass(leases=leases(), now=NOW, config=materialize_config())
    schedule_resume(schedule=Schedule.objects.get(pk=schedule.pk), actor="test")

    assert paused == []
    assert passed.schedules == 0
    assert _cursor(schedule) == [(schedule.shard, datetime(2026, 12, 2, 12, 1, tzinfo=UTC))]


def test_cancel_and_completion_leave_nothing_due(tenant_a):
    canceled = make_schedule(tenant_a)
    run_at = timezone.now() + timedelta(hours=1)
    one_shot = make_schedule(tenant_a, kind=Schedule.Kind.ONE_SHOT, expression="", run_at=run_at)

    schedule_cancel(schedule=canceled, actor="test")
    materialize_pass(leases=leases(), now=run_at, config=materialize_config())

    one_shot.refresh_from_db()
    assert one_shot.state == Schedule.State.COMPLETED
    assert _cursor(canceled) == []
    assert _cursor(one_shot) == []


def test_an_update_moves_the_cursor_to_the_new_rules_first_instant(tenant_a):
    schedule = make_schedule(tenant_a, expression="0 3 * * *")
    spec = ScheduleSpec(
        name="test schedule", kind=Schedule.Kind.CRON, expression="0 5 * * *", time_zone="UTC",
        handler="record",
    )  # fmt: skip

    result = schedule_update(schedule=schedule, spec=spec, actor="test")

    updated = Schedule.objects.get(pk=result.schedule.pk)
    assert updated.next_run_at is not None and updated.next_run_at.hour == 5
    assert _cursor(updated) == [(updated.shard, updated.next_run_at)]


def test_deleted_schedules_leave_the_cursor(tenant_a):
    schedule = make_schedule(tenant_a)

    Schedule.objects.filter(pk=schedule.pk).delete()

    assert _cursor(schedule) == []


def test_no_index_of_the_schedule_row_holds_next_run_at():
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT pg_get_indexdef(indexrelid) FROM pg_index
            WHERE indrelid = 'schedules_schedule'::regclass
            """
        )
        definitions = [row[0] for row in cursor.fetchall()]

    assert definitions and not [sql for sql in definitions if "next_run_at" in sql]
