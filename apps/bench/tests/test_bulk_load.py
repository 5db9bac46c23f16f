"""The extra-active bulk load: rows as the create service writes them, indexes as they were."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.conf import settings
from django.db import connection

from apps.bench.bulk_load import LOADED_TABLES, load_not_due_schedules
from apps.bench.fixtures import cron_definition
from apps.schedules.models import Schedule, ScheduleEvent, ScheduleVersion, shard_for

pytestmark = pytest.mark.django_db

NEXT_YEAR = datetime(2027, 1, 1, tzinfo=UTC)


def _index_definitions() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = ANY(%s)", [list(LOADED_TABLES)]
        )
        return {row[0] for row in cursor.fetchall()}


def test_loaded_schedules_are_whole_and_every_index_is_back(tenant_a, tenant_b):
    before = _index_definitions()
    definition = cron_definition("0 0 1 1 *", precision=Schedule.Precision.STRICT, window_s=0)

    load_not_due_schedules(
        [tenant_a.id, tenant_b.id], [3, 1], 8, expression="0 0 1 1 *", next_run_at=NEXT_YEAR,
        definition=definition, say=lambda _: None,
    )  # fmt: skip

    assert _index_definitions() == before
    schedules = list(Schedule.objects.all())
    assert len(schedules) == 8
    assert sum(s.tenant_id == tenant_a.id for s in schedules) == 6  # weights 3 : 1
    for schedule in schedules:
        assert schedule.shard == shard_for(schedule.id, settings.TICK_SHARDS)
        assert (schedule.state, schedule.version, schedule.next_run_at) == (
            Schedule.State.ACTIVE, 1, NEXT_YEAR,
        )  # fmt: skip
    assert ScheduleVersion.objects.filter(version=1).count() == 8
    assert ScheduleEvent.objects.filter(kind=ScheduleEvent.Kind.CREATED).count() == 8
    # The due index still finds them (rebuilt, not left out).
    assert Schedule.objects.filter(state=Schedule.State.ACTIVE, next_run_at=NEXT_YEAR).count() == 8
