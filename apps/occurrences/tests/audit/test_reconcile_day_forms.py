"""The reconciliation audit with the day forms (L, L-n, dL, d#n, ?): its independent
matcher computes their instants itself, so a deleted occurrence of such a rule is found."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from apps.occurrences.audit.reconcile import FAILING, reconcile
from apps.occurrences.models import DispatchOutbox, Occurrence
from apps.occurrences.pipeline.materializer import materialize_pass
from apps.occurrences.tests.support.pipeline import leases, materialize_config
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule
from apps.tenants.models import Tenant

pytestmark = pytest.mark.django_db

# 2026-03-29 is the last (and fifth) Sunday of March and two days before its last day; Europe/
# Berlin springs forward that night at 01:00 UTC (02:00 local does not exist).
T0 = datetime(2026, 3, 29, 0, 0, tzinfo=UTC)
START, END = T0 - timedelta(hours=2), T0 + timedelta(hours=4)


def _failing(start: datetime, end: datetime) -> set[tuple[str, str, str]]:
    report = reconcile(start=start, end=end, chunk_size=7, now=START)
    return {
        (kind, f.schedule_id, f.scheduled_for)
        for kind in FAILING
        for f in report.samples.get(kind, [])
    }


def _materialized(tenant: Tenant) -> dict[str, Schedule]:
    with time_machine.travel(START, tick=False):
        made = {
            expression: make_schedule(
                tenant, name=expression, expression=expression, time_zone=zone
            )
            for expression, zone in [
                ("15 * * * SUNL", "Europe/Berlin"),
                ("*/30 * L-2 * ?", "UTC"),
                ("0 * ? * SUN#5", "UTC"),
                ("45 * L * SUN#5", "Asia/Tokyo"),
            ]
        }
        materialize_pass(leases=leases(), now=START, config=materialize_config(window_s=6 * 3600))
    return made


def test_a_deleted_occurrence_of_each_day_form_rule_is_found_and_nothing_else(
    tenant_a: Tenant,
) -> None:
    made = _materialized(tenant_a)
    # Clean first: every form produced its occurrences on the day, and none is flagged.
    for schedule in made.values():
        assert Occurrence.objects.filter(schedule=schedule).count() >= 4, schedule.name
    assert _failing(START, END) == set()
    # The Berlin rule skips 02:15 local (the gap): 01:15 CET, then 03:15 CEST.
    berlin = made["15 * * * SUNL"]
    berlin_times = sorted(
        Occurrence.objects.filter(schedule=berlin).values_list("scheduled_for", flat=True)
    )
    assert datetime(2026, 3, 29, 0, 15, tzinfo=UTC) in berlin_times
    assert datetime(2026, 3, 29, 1, 15, tzinfo=UTC) in berlin_times  # 03:15 CEST

    planted = set()
    for schedule in made.values():
        victim = Occurrence.objects.filter(schedule=schedule).order_by("scheduled_for")[2]
        Occurrence.objects.filter(id=victim.id, scheduled_for=victim.scheduled_for).delete()
        DispatchOutbox.objects.filter(occurrence_id=victim.id).delete()
        planted.add(("missing", str(schedule.id), victim.scheduled_for.isoformat()))

    assert _failing(START, END) == planted
