"""bench_outage's per-policy figures from stored rows, without running the benchmark: an
instant is late by what happened to it, not by when it fell due."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.bench.outage import LATENESS_S, policy_figures
from apps.occurrences.models import Lane, Occurrence
from apps.occurrences.tests.support.rows import attempt_started, occurrence, schedule
from apps.schedules.models import Schedule

pytestmark = pytest.mark.django_db


def test_an_instant_due_just_before_the_restart_that_ran_on_time_is_not_expected_late(tenant_a):
    # given: a CATCHUP schedule (K = 5) whose two instants of the outage ran late in the
    # catch-up lane, and whose instant due 10 s before the restart ran 3 s after it - on time
    first = (timezone.now() - timedelta(hours=2)).replace(second=0, microsecond=0)
    restart = first + timedelta(minutes=3, seconds=10)
    sched = schedule(tenant_a, misfire_policy=Schedule.MisfirePolicy.CATCHUP, catchup_limit=5,
                     max_lateness_s=LATENESS_S)  # fmt: skip
    for minute in (1, 2):
        occ = occurrence(sched, first + timedelta(minutes=minute), state=Occurrence.State.SUCCEEDED)
        Occurrence.objects.filter(id=occ.id).update(lane=Lane.CATCHUP)
        attempt_started(occ, restart + timedelta(seconds=4))
    on_time = occurrence(sched, first + timedelta(minutes=3), state=Occurrence.State.SUCCEEDED)
    attempt_started(on_time, restart + timedelta(seconds=3))

    figures = policy_figures(
        tenant_a.id, Schedule.MisfirePolicy.CATCHUP, 5, since=first + timedelta(minutes=1),
        restart=restart, until=restart + timedelta(minutes=2),
    )  # fmt: skip

    # then: two late instants, both ran; an earlier count by the clock expected three
    assert figures["expected"] == 2
    assert figures["ran"] == 2
    assert figures["schedules_off_policy"] == 0
    assert figures["late_after_restart"] == 0


def test_an_on_time_instant_made_late_by_the_recovery_is_counted_apart(tenant_a):
    # given: FIRE_ONCE; the latest outage instant ran late, the older one MISSED; the first
    # instant after the restart started 30 s after it fell due
    first = (timezone.now() - timedelta(hours=2)).replace(second=0, microsecond=0)
    restart = first + timedelta(minutes=2, seconds=40)
    sched = schedule(tenant_a, misfire_policy=Schedule.MisfirePolicy.FIRE_ONCE,
                     max_lateness_s=LATENESS_S)  # fmt: skip
    occurrence(sched, first + timedelta(minutes=1), state=Occurrence.State.MISSED)
    ran = occurrence(sched, first + timedelta(minutes=2), state=Occurrence.State.SUCCEEDED)
    attempt_started(ran, restart + timedelta(seconds=2))
    after = occurrence(sched, first + timedelta(minutes=3), state=Occurrence.State.SUCCEEDED)
    attempt_started(after, first + timedelta(minutes=3, seconds=30))

    figures = policy_figures(
        tenant_a.id, Schedule.MisfirePolicy.FIRE_ONCE, 0, since=first + timedelta(minutes=1),
        restart=restart, until=restart + timedelta(minutes=2),
    )  # fmt: skip

    assert figures["ran_outage_instants"] == 1
    assert figures["missed"] == 1
    assert figures["late_after_restart"] == 1
    # two late runs where one was allowed: off policy, and the figure says why
    assert figures["schedules_off_policy"] == 1
