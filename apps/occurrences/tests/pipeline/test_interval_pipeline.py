"""Fixed-rate (interval) schedules through the pipeline on the real database: the
materializer writes their instants (exactly the period apart across a DST change), the
misfire policy judges late ones as for cron, backfill finds them, and the reconciliation
audit expects them by its own arithmetic and finds a planted gap."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine

from apps.occurrences.audit.reconcile import FAILING, reconcile
from apps.occurrences.manual_runs import backfill_instants
from apps.occurrences.models import DispatchOutbox, Lane, Occurrence
from apps.occurrences.pipeline.materializer import materialize_pass
from apps.occurrences.tests.support.pipeline import leases, materialize_config
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule
from apps.tenants.models import Tenant

pytestmark = pytest.mark.django_db

# Europe/Berlin springs forward on 2026-03-29 at 01:00 UTC (02:00 CET -> 03:00 CEST).
ANCHOR = datetime(2026, 3, 28, 20, 10, tzinfo=UTC)
NOW = datetime(2026, 3, 28, 22, 0, tzinfo=UTC)
PERIOD = timedelta(minutes=90)


def _interval(tenant: Tenant, **fields: Any) -> Schedule:
    values: dict[str, Any] = {
        "name": "every 90 minutes",
        "kind": Schedule.Kind.INTERVAL,
        "expression": "",
        "interval_s": 5400,
        "start_at": ANCHOR,
        "time_zone": "Europe/Berlin",
    }
    values.update(fields)
    return make_schedule(tenant, **values)


def _instants(schedule: Schedule, **filters: Any) -> list[datetime]:
    return sorted(
        Occurrence.objects.filter(schedule=schedule, **filters).values_list(
            "scheduled_for", flat=True
        )
    )


def _failing(start: datetime, end: datetime) -> set[tuple[str, str, str]]:
    report = reconcile(start=start, end=end, chunk_size=7, now=start)
    return {
        (kind, f.schedule_id, f.scheduled_for)
        for kind in FAILING
        for f in report.samples.get(kind, [])
    }


def test_the_materializer_writes_instants_the_period_apart_across_dst_and_the_audit_agrees(
    tenant_a,
):
    with time_machine.travel(NOW, tick=False):
        schedule = _interval(tenant_a)
        materialize_pass(leases=leases(), now=NOW, config=materialize_config(window_s=6 * 3600))

    times = _instants(schedule)
    # 23:10, 00:40, 02:10 (04:10 CEST: the clocks jumped at 01:00 in between), 03:40 UTC
    assert times == [ANCHOR + k * PERIOD for k in range(2, 6)]
    assert all(b - a == PERIOD for a, b in zip(times, times[1:], strict=False))
    assert DispatchOutbox.objects.filter(schedule_id=schedule.id).count() == len(times)
    schedule.refresh_from_db()
    assert schedule.next_run_at == ANCHOR + 6 * PERIOD

    start, end = NOW, NOW + timedelta(hours=6)
    assert _failing(start, end) == set()
    victim = Occurrence.objects.get(schedule=schedule, scheduled_for=times[2])
    Occurrence.objects.filter(id=victim.id, scheduled_for=victim.scheduled_for).delete()
    DispatchOutbox.objects.filter(occurrence_id=victim.id).delete()
    assert _failing(start, end) == {("missing", str(schedule.id), times[2].isoformat())}


def test_a_second_pass_writes_nothing_twice_and_a_batch_mixes_kinds(tenant_a):
    with time_machine.travel(NOW, tick=False):
        interval = _interval(tenant_a)
        cron = make_schedule(tenant_a, expression="*/30 * * * *", time_zone="Europe/Berlin")
        config = materialize_config(window_s=3 * 3600)
        materialize_pass(leases=leases(), now=NOW, config=config)
        materialize_pass(leases=leases(), now=NOW, config=config)

    assert _instants(interval) == [ANCHOR + k * PERIOD for k in (2, 3)]
    assert len(_instants(cron)) == 6


@pytest.mark.parametrize(
    ("policy", "limit", "late_fired"),
    [
        (Schedule.MisfirePolicy.SKIP, 0, 0),
        (Schedule.MisfirePolicy.FIRE_ONCE, 0, 1),
        (Schedule.MisfirePolicy.CATCHUP, 3, 3),
    ],
)
def test_late_instants_are_judged_by_the_misfire_policy_on_the_phase(
    tenant_a, policy, limit, late_fired
):
    # An every-10-minutes rate anchored at :03, down for an hour: its late instants stay on
    # the anchor's phase and the policy fires none, the latest, or up to the limit of them.
    anchor = datetime(2026, 3, 28, 20, 3, tzinfo=UTC)
    with time_machine.travel(NOW, tick=False):
        schedule = _interval(
            tenant_a, interval_s=600, start_at=anchor, misfire_policy=policy,
            catchup_limit=limit, max_lateness_s=60,
            next_run_at=datetime(2026, 3, 28, 21, 3, tzinfo=UTC),
        )  # fmt: skip
        materialize_pass(leases=leases(), now=NOW, config=materialize_config())

    late = [datetime(2026, 3, 28, 21, m, tzinfo=UTC) for m in (3, 13, 23, 33, 43, 53)]
    fired_late = _instants(schedule, lane=Lane.CATCHUP, state=Occurrence.State.SCHEDULED)
    assert fired_late == late[len(late) - late_fired :]
    assert _instants(schedule, state=Occurrence.State.MISSED) == late[: len(late) - late_fired]
    assert _instants(schedule, lane=Lane.STRICT) == []  # 22:03 is past the 2-minute window
    schedule.refresh_from_db()
    assert schedule.next_run_at == datetime(2026, 3, 28, 22, 3, tzinfo=UTC)


def test_backfill_finds_the_instants_of_a_past_range_within_start_at(tenant_a):
    with time_machine.travel(NOW, tick=False):
        schedule = _interval(tenant_a)

    found = backfill_instants(schedule=schedule, start=ANCHOR - timedelta(hours=5), end=NOW)

    assert found == [ANCHOR, ANCHOR + PERIOD]
    assert found[0].tzinfo == UTC
