"""The misfire policy applied wherever lateness is found: occurrences written before an outage
(in the outbox, or ENQUEUED in the queue) are judged when the relay or a claim finds them
late, by the same rule as the instants the materializer writes late - against the real
database and RabbitMQ."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from apps.occurrences.audit.reconcile import FAILING, POLICY_BREACHES, reconcile
from apps.occurrences.execution.claim import ClaimStatus, occurrence_claim
from apps.occurrences.misfire import late_runs_allowed
from apps.occurrences.models import Attempt, DispatchOutbox, Lane, Occurrence, ShardLease
from apps.occurrences.pipeline.materializer import materialize_pass
from apps.occurrences.pipeline.relay import relay_step
from apps.occurrences.tests.support.pipeline import leases, materialize_config, relay_config
from apps.schedules.models import Schedule, ScheduleEvent
from apps.schedules.tests.factories import make_schedule

pytestmark = [pytest.mark.django_db, pytest.mark.clock_edge]

LATENESS_S = 20
OUTAGE_MINUTES = 10


def _before_outage(tenant, policy: str, catchup_limit: int = 0) -> tuple[Schedule, datetime]:
    """An every-minute schedule whose first two instants (t0, t0 + 1 min) the materializer
    wrote into the outbox just before a ten-minute control-plane outage; returns it and t0."""
    t0 = (timezone.now() - timedelta(minutes=OUTAGE_MINUTES)).replace(second=0, microsecond=0)
    sched = make_schedule(
        tenant, expression="* * * * *", next_run_at=t0, misfire_policy=policy,
        catchup_limit=catchup_limit, max_lateness_s=LATENESS_S,
    )  # fmt: skip
    materialize_pass(leases=leases(), now=t0 - timedelta(seconds=30), config=materialize_config())
    assert DispatchOutbox.objects.filter(schedule_id=sched.id).count() == 2
    return sched, t0


def _relay(prefix: str, publisher) -> None:
    relay_step(leases=leases(ShardLease.Role.RELAY), publisher=publisher,
               config=relay_config(prefix))  # fmt: skip


def test_a_backlog_of_late_rows_beyond_a_step_s_judge_budget_is_all_judged_over_later_steps(
    tenant_a, queue_prefix, publisher
):
    # given: six schedules' twelve outbox rows, written before the outage, all late now:
    # three SKIP schedules (given up) and three CATCHUP ones whose limit runs them all
    skip = [_before_outage(tenant_a, Schedule.MisfirePolicy.SKIP)[0] for _ in range(3)]
    catchup = [_before_outage(tenant_a, Schedule.MisfirePolicy.CATCHUP, 20)[0] for _ in range(3)]
    relay_leases = leases(ShardLease.Role.RELAY)
    # A step's judge budget spent after its first chunk of five.
    config = replace(relay_config(queue_prefix), judge_chunk_rows=5, judge_budget_s=0.0)

    # when: one step judges five, the seven others are left in the outbox untouched
    first = relay_step(leases=relay_leases, publisher=publisher, config=config)
    assert (first.claimed, first.unjudged) == (12, 7)
    assert DispatchOutbox.objects.filter(lane=Lane.STRICT).count() == 7
    assert (
        Occurrence.objects.filter(state=Occurrence.State.SCHEDULED, lane=Lane.STRICT).count() == 7
    )
    # and the next steps judge the rest
    steps = [relay_step(leases=relay_leases, publisher=publisher, config=config) for _ in range(2)]
    assert [s.unjudged for s in steps] == [2, 0]

    # then: every one was judged once, none lost
    assert first.missed + sum(s.missed for s in steps) == 6
    assert first.published + sum(s.published for s in steps) == 6
    assert not DispatchOutbox.objects.exists()
    for sched in skip:
        assert {o.state for o in Occurrence.objects.filter(schedule=sched)} == {
            Occurrence.State.MISSED
        }
    for sched in catchup:
        ran = Occurrence.objects.filter(schedule=sched)
        assert {(o.state, o.lane) for o in ran} == {(Occurrence.State.ENQUEUED, Lane.CATCHUP)}


def test_within_its_budget_a_step_judges_every_chunk_of_late_rows(
    tenant_a, queue_prefix, publisher
):
    for _ in range(3):
        _before_outage(tenant_a, Schedule.MisfirePolicy.SKIP)
    config = replace(relay_config(queue_prefix), judge_chunk_rows=4, judge_budget_s=600.0)

    result = relay_step(leases=leases(ShardLease.Role.RELAY), publisher=publisher, config=config)

    assert (result.claimed, result.unjudged, result.missed) == (6, 0, 6)
    assert not DispatchOutbox.objects.exists()


def _materialize() -> None:
    materialize_pass(leases=leases(), now=timezone.now(), config=materialize_config())


def _late_runnable(sched: Schedule) -> list[Occurrence]:
    """Occurrences of the outage still to run (published or not), oldest first."""
    cutoff = timezone.now() - timedelta(seconds=LATENESS_S)
    return list(
        Occurrence.objects.filter(schedule=sched, scheduled_for__lt=cutoff)
        .exclude(state=Occurrence.State.MISSED)
        .order_by("scheduled_for")
    )


@pytest.mark.parametrize("relay_first", [True, False], ids=["relay-first", "materializer-first"])
@pytest.mark.parametrize(
    ("policy", "limit"),
    [
        (Schedule.MisfirePolicy.SKIP, 0),
        (Schedule.MisfirePolicy.FIRE_ONCE, 0),
        (Schedule.MisfirePolicy.CATCHUP, 5),
    ],
)
def test_instants_written_before_an_outage_get_the_policy_when_found_late(
    tenant_a, queue_prefix, publisher, policy, limit, relay_first
):
    sched, t0 = _before_outage(tenant_a, policy, limit)

    steps = (_relay, _materialize) if relay_first else (_materialize, _relay)
    for step in steps:
        step(queue_prefix, publisher) if step is _relay else step()  # type: ignore[call-arg]
    _relay(queue_prefix, publisher)

    runnable = _late_runnable(sched)
    # Exactly the latest instants the policy allows run, all in the catch-up lane: the two
    # written before the outage are among the MISSED (later late instants outrank them).
    assert len(runnable) == late_runs_allowed(policy, limit)
    assert all(o.lane == Lane.CATCHUP for o in runnable)
    assert t0 not in {o.scheduled_for for o in runnable}
    assert t0 + timedelta(minutes=1) not in {o.scheduled_for for o in runnable}
    latest_late = max(
        o.scheduled_for for o in Occurrence.objects.filter(schedule=sched)
        if o.scheduled_for < timezone.now() - timedelta(seconds=LATENESS_S)
    )  # fmt: skip
    if runnable:
        assert runnable[-1].scheduled_for == latest_late
    for at in (t0, t0 + timedelta(minutes=1)):
        assert Occurrence.objects.get(schedule=sched, scheduled_for=at).state == "MISSED"
    # Nothing of the outage is left waiting to be published.
    assert not DispatchOutbox.objects.filter(
        schedule_id=sched.id, lane=Lane.STRICT, scheduled_for__lt=timezone.now()
    ).exists()
    assert ScheduleEvent.objects.filter(schedule=sched, kind=ScheduleEvent.Kind.MISSED).exists()


def test_catchup_runs_every_late_instant_when_fewer_than_its_limit(
    tenant_a, queue_prefix, publisher
):
    t0 = (timezone.now() - timedelta(minutes=3)).replace(second=0, microsecond=0)
    sched = make_schedule(
        tenant_a, expression="* * * * *", next_run_at=t0, max_lateness_s=LATENESS_S,
        misfire_policy=Schedule.MisfirePolicy.CATCHUP, catchup_limit=5,
    )  # fmt: skip
    materialize_pass(leases=leases(), now=t0 - timedelta(seconds=30), config=materialize_config())

    _relay(queue_prefix, publisher)
    _materialize()
    _relay(queue_prefix, publisher)

    late = Occurrence.objects.filter(
        schedule=sched, scheduled_for__lt=timezone.now() - timedelta(seconds=LATENESS_S)
    )
    assert late.count() >= 3
    assert not late.filter(state=Occurrence.State.MISSED).exists()


@pytest.mark.parametrize("late_instants", [1, 2, 3, 4, 5, 6])
def test_the_materializer_fires_min_k_and_missed_of_the_instants_it_writes_late(
    tenant_a, late_instants
):
    # given: CATCHUP with K = 5; the materializer was down while `late_instants` minutes fell
    # due (none written before). With 3 or 4 a negative slice start once fired only 2 or 1.
    now = timezone.now()
    cutoff = now - timedelta(seconds=LATENESS_S)
    first = cutoff.replace(second=0, microsecond=0) - timedelta(minutes=late_instants - 1)
    if first >= cutoff:
        first -= timedelta(minutes=1)
    sched = make_schedule(
        tenant_a, expression="* * * * *", next_run_at=first, max_lateness_s=LATENESS_S,
        misfire_policy=Schedule.MisfirePolicy.CATCHUP, catchup_limit=5,
    )  # fmt: skip
    late = Occurrence.objects.filter(schedule=sched, scheduled_for__lt=cutoff)

    materialize_pass(leases=leases(), now=now, config=materialize_config())

    missed = late.count() - min(5, late.count())
    assert late.count() >= late_instants
    assert late.filter(lane=Lane.CATCHUP).exclude(state=Occurrence.State.MISSED).count() == min(
        5, late.count()
    )
    assert late.filter(state=Occurrence.State.MISSED).count() == missed


def test_enqueued_occurrences_found_late_at_claim_fire_once_runs_only_the_latest(
    tenant_a, queue_prefix, publisher
):
    sched, t0 = _before_outage(tenant_a, Schedule.MisfirePolicy.FIRE_ONCE)
    # The relay published both before the outage (they sit ENQUEUED in the queue); the
    # materializer caught up meanwhile without anything late of its own.
    Occurrence.objects.filter(schedule=sched).update(
        state=Occurrence.State.ENQUEUED, enqueued_at=t0
    )
    DispatchOutbox.objects.filter(schedule_id=sched.id).delete()
    Schedule.objects.filter(pk=sched.pk).update(next_run_at=timezone.now() + timedelta(hours=1))
    first, second = Occurrence.objects.filter(schedule=sched).order_by("scheduled_for")

    claims = [
        occurrence_claim(occurrence_id=o.id, scheduled_for=o.scheduled_for, worker_id="w")
        for o in (first, second)
    ]

    assert [c.status for c in claims] == [ClaimStatus.MISSED, ClaimStatus.CLAIMED]
    second.refresh_from_db()
    assert second.lane == Lane.CATCHUP


def test_skip_gives_up_an_enqueued_occurrence_found_late_at_claim(tenant_a):
    sched, _ = _before_outage(tenant_a, Schedule.MisfirePolicy.SKIP)
    Occurrence.objects.filter(schedule=sched).update(state=Occurrence.State.ENQUEUED)
    occ = Occurrence.objects.filter(schedule=sched).order_by("scheduled_for").last()
    assert occ is not None

    on_time = occurrence_claim(
        occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w",
        now=occ.scheduled_for + timedelta(seconds=LATENESS_S - 1),
    )  # fmt: skip
    assert on_time.status == ClaimStatus.CLAIMED

    late = Occurrence.objects.filter(schedule=sched).order_by("scheduled_for").first()
    assert late is not None
    claim = occurrence_claim(occurrence_id=late.id, scheduled_for=late.scheduled_for,
                             worker_id="w")  # fmt: skip
    assert claim.status == ClaimStatus.MISSED
    late.refresh_from_db()
    assert late.state == Occurrence.State.MISSED


def _ran(occ: Occurrence, started_at: datetime) -> None:
    """`occ` ran once, its first attempt starting at `started_at`, and succeeded."""
    Occurrence.objects.filter(id=occ.id, scheduled_for=occ.scheduled_for).update(
        state=Occurrence.State.SUCCEEDED, attempt_count=1, finished_at=started_at
    )
    Attempt.objects.create(
        scheduled_for=occ.scheduled_for, occurrence_id=occ.id, tenant_id=occ.tenant_id,
        attempt_no=1, lease_token=uuid.uuid4(), lease_expires_at=started_at,
        worker_id="w", started_at=started_at, finished_at=started_at,
        outcome=Attempt.Outcome.SUCCEEDED,
    )  # fmt: skip


def _breaches(sched: Schedule) -> dict[str, int]:
    report = reconcile(
        start=sched.created_at - timedelta(hours=1), end=timezone.now() + timedelta(hours=1)
    )
    return {kind: report.counts[kind] for kind in POLICY_BREACHES if report.counts[kind]}


@pytest.mark.parametrize(
    ("policy", "limit"),
    [
        (Schedule.MisfirePolicy.SKIP, 0),
        (Schedule.MisfirePolicy.FIRE_ONCE, 0),
        (Schedule.MisfirePolicy.CATCHUP, 5),
    ],
)
def test_reconcile_agrees_with_the_policy_after_an_outage_and_fails_on_a_planted_breach(
    tenant_a, queue_prefix, publisher, policy, limit
):
    sched, t0 = _before_outage(tenant_a, policy, limit)
    _relay(queue_prefix, publisher)
    _materialize()
    _relay(queue_prefix, publisher)
    now = timezone.now()
    for occ in _late_runnable(sched):
        _ran(occ, now)
    assert _breaches(sched) == {}

    # Planted: the instant written before the outage ran nine minutes late anyway, as the
    # relay did before the policy was judged where lateness is found.
    first = Occurrence.objects.get(schedule=sched, scheduled_for=t0)
    _ran(first, now)

    expected = {
        Schedule.MisfirePolicy.SKIP: "late_run_skip",
        Schedule.MisfirePolicy.FIRE_ONCE: "late_runs_fire_once",
        Schedule.MisfirePolicy.CATCHUP: "late_runs_catchup",
    }[policy]
    assert _breaches(sched) == {expected: 1}
    assert expected in FAILING


@pytest.mark.parametrize(
    ("policy", "limit"),
    [(Schedule.MisfirePolicy.FIRE_ONCE, 0), (Schedule.MisfirePolicy.CATCHUP, 5)],
)
def test_reconcile_fails_on_an_instant_given_up_that_the_policy_let_run(
    tenant_a, queue_prefix, publisher, policy, limit
):
    sched, _ = _before_outage(tenant_a, policy, limit)
    _relay(queue_prefix, publisher)
    _materialize()
    _relay(queue_prefix, publisher)
    runnable = _late_runnable(sched)
    assert len(runnable) == late_runs_allowed(policy, limit)
    now = timezone.now()
    for occ in runnable[1:]:
        _ran(occ, now)

    # Planted: the oldest instant the policy let run was given up instead - CATCHUP ran
    # K - 1 of its late instants, FIRE_ONCE none.
    oldest = runnable[0]
    Occurrence.objects.filter(id=oldest.id, scheduled_for=oldest.scheduled_for).update(
        state=Occurrence.State.MISSED, finished_at=now
    )

    assert _breaches(sched) == {"late_runs_too_few": 1}
    assert "late_runs_too_few" in FAILING
