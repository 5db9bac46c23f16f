"""After a control-plane outage longer than the planning window, each misfire policy holds and
strict work is untouched by the recovery (real materializer, relay, reaper and two workers on
the test database and RabbitMQ; the outage is played by writing the instants a materializer
wrote before it, publishing some of them, then starting the processes ten minutes later)."""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import time_machine
from django.utils import timezone

from apps.occurrences.audit.reconcile import POLICY_BREACHES, reconcile
from apps.occurrences.models import Attempt, Occurrence, ShardLease
from apps.occurrences.pipeline.materializer import materialize_pass
from apps.occurrences.pipeline.relay import relay_step
from apps.occurrences.tests.support.pipeline import leases, materialize_config, relay_config
from apps.occurrences.tests.support.processes import ProcessStack, shared_stack_env
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule
from apps.tenants.services import tenant_create

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PER_TENANT, LATENESS_S, CATCHUP_LIMIT, OUTAGE_MIN = 8, 20, 5, 10
BYSTANDERS, BYSTANDER_DELAY_S = 10, 15


def _wait(predicate, timeout_s: float, stack: ProcessStack, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        stack.assert_alive()
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s} s")


def _late_runs(schedule: Schedule, restart: datetime) -> int:
    """Runs of the outage's instants (late when the processes came back) that started later
    than the max lateness after their instant."""
    return sum(
        1
        for a in Attempt.objects.filter(
            occurrence_id__in=Occurrence.objects.filter(schedule=schedule).values("id"),
            scheduled_for__lt=restart - timedelta(seconds=LATENESS_S),
            attempt_no=1,
        )
        if (a.started_at - a.scheduled_for).total_seconds() > LATENESS_S
    )


def _settled(schedules: list[Schedule], restart: datetime) -> bool:
    """Nothing of the outage is left to run: the materializer has written every schedule's
    outage instants (its next run is past the cutoff), and every instant before the cutoff is
    finished (MISSED or run to its end). The first half matters: the relay may give up the
    instants written before the outage before the materializer reaches a schedule, and a
    schedule it has not reached yet has only finished rows."""
    cutoff = restart - timedelta(seconds=LATENESS_S)
    if Schedule.objects.filter(id__in=[s.id for s in schedules], next_run_at__lt=cutoff).exists():
        return False
    return not Occurrence.objects.filter(
        schedule__in=schedules, scheduled_for__lt=cutoff, finished_at__isnull=True
    ).exists()


def test_each_policy_holds_after_an_outage_and_strict_runs_are_untouched(
    queue_prefix: str, publisher, tmp_path: Path
) -> None:
    # given: three tenants' every-minute schedules (SKIP, FIRE_ONCE, CATCHUP with K = 5 at
    # 2 catch-up runs/s), each run taking half a second; the materializer wrote their first two
    # instants just before a ten-minute outage, and the relay published the first of them.
    # The rule lists the outage's ten minutes only: no on-time instant falls due while the
    # test runs (one would rightly run late, too, on a busy machine).
    t0 = (timezone.now() - timedelta(minutes=OUTAGE_MIN + 1)).replace(second=0, microsecond=0)
    minutes = ",".join(str((t0 + timedelta(minutes=m)).minute) for m in range(OUTAGE_MIN))
    policies = {
        Schedule.MisfirePolicy.SKIP: 0,
        Schedule.MisfirePolicy.FIRE_ONCE: 0,
        Schedule.MisfirePolicy.CATCHUP: CATCHUP_LIMIT,
    }
    schedules: dict[str, list[Schedule]] = {}
    for policy, limit in policies.items():
        tenant = tenant_create(slug=f"outage-{policy.lower().replace('_', '-')}")
        tenant.catchup_rate_per_s = 2
        tenant.save(update_fields=["catchup_rate_per_s"])
        schedules[policy] = [
            make_schedule(
                tenant, name=f"{policy}-{i}", expression=f"{minutes} * * * *", next_run_at=t0,
                misfire_policy=policy, catchup_limit=limit, max_lateness_s=LATENESS_S,
                payload={"sleep_s": 0.5},
            )
            for i in range(PER_TENANT)
        ]  # fmt: skip
    materialize_pass(leases=leases(), now=t0 - timedelta(seconds=30), config=materialize_config())
    with time_machine.travel(t0 + timedelta(seconds=1), tick=False):
        relay_step(leases=leases(ShardLease.Role.RELAY, owner="before-outage"),
                   publisher=publisher, config=relay_config(queue_prefix))  # fmt: skip
    assert Occurrence.objects.filter(state=Occurrence.State.ENQUEUED).count() == 3 * PER_TENANT
    # and a bystander tenant's strict one-shots fall due while the recovery runs
    bystander = tenant_create(slug="outage-bystander")
    restart = timezone.now()
    due = (restart + timedelta(seconds=BYSTANDER_DELAY_S)).replace(microsecond=0)
    strict = [
        make_schedule(bystander, name=f"bystander-{i}", kind=Schedule.Kind.ONE_SHOT,
                      expression="", run_at=due, misfire_policy=Schedule.MisfirePolicy.FIRE_ONCE,
                      max_lateness_s=LATENESS_S)
        for i in range(BYSTANDERS)
    ]  # fmt: skip

    # when: the control plane comes back (the workers with it)
    stack = ProcessStack(tmp_path, shared_stack_env(queue_prefix, TICK_STRICT_RESERVED_SHARE="0.5"))
    try:
        for role in ("materialize", "relay", "reap"):
            stack.start_role(role)
        for name in ("w1", "w2"):
            stack.start_role("worker", name=name, concurrency=2)
        everything = [s for group in schedules.values() for s in group]
        _wait(lambda: _settled(everything, restart), 120, stack, "the outage's instants")
        _wait(lambda: Occurrence.objects.filter(schedule__in=strict,
                                                finished_at__isnull=False).count() == BYSTANDERS,
              60, stack, "the bystander's runs")  # fmt: skip
    finally:
        stack.stop_all()

    # then: SKIP ran no late instant, FIRE_ONCE exactly one per schedule, CATCHUP exactly K
    late = {p: Counter(_late_runs(s, restart) for s in group) for p, group in schedules.items()}
    assert late == {
        Schedule.MisfirePolicy.SKIP: Counter({0: PER_TENANT}),
        Schedule.MisfirePolicy.FIRE_ONCE: Counter({1: PER_TENANT}),
        Schedule.MisfirePolicy.CATCHUP: Counter({CATCHUP_LIMIT: PER_TENANT}),
    }
    # and the written-before-the-outage instants, queued or not, were MISSED
    for at in (t0, t0 + timedelta(minutes=1)):
        assert set(
            Occurrence.objects.filter(schedule__in=everything, scheduled_for=at).values_list(
                "state", flat=True
            )
        ) == {Occurrence.State.MISSED}
    # and the bystander's strict runs started soon after they were enqueued, beside the
    # recovery: the workers keep the reserved slots from it. p90 of ten: one run may wait
    # for a recovery claim that a worker process took before its cached count (1 s) caught
    # up. The enqueue lag is the relay's, reported, not judged here (on a loaded two-core
    # machine it reached 4-5 s).
    started = {
        a.occurrence_id: a.started_at
        for a in Attempt.objects.filter(tenant=bystander, attempt_no=1)
    }
    waits = sorted(
        ((started[o.id] - o.enqueued_at).total_seconds(), o.enqueued_at - o.scheduled_for)
        for o in Occurrence.objects.filter(schedule__in=strict)
        if o.enqueued_at is not None
    )
    assert len(waits) == BYSTANDERS and waits[int(0.9 * BYSTANDERS) - 1][0] <= 5, waits
    # and reconcile agrees: no policy breach, nothing missing
    report = reconcile(start=t0 - timedelta(hours=1), end=timezone.now() + timedelta(minutes=5))
    assert {k: report.counts[k] for k in (*POLICY_BREACHES, "missing") if report.counts[k]} == {}
