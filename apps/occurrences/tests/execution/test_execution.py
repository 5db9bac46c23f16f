"""Claim and fenced completion against the real database."""

from __future__ import annotations

import random
import threading
from datetime import timedelta
from unittest import mock

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from apps.occurrences.execution.claim import ClaimStatus, occurrence_claim
from apps.occurrences.execution.complete import attempt_complete, retry_delay
from apps.occurrences.execution.heartbeat import LeaseHeartbeat, attempt_heartbeat
from apps.occurrences.execution.reaper import attempts_reap
from apps.occurrences.execution.run import occurrence_execute
from apps.occurrences.models import Attempt, DispatchOutbox, HandlerEffect, Lane, Occurrence
from apps.occurrences.pipeline.materializer import materialize_pass
from apps.occurrences.tests.support.pipeline import leases, materialize_config
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule

pytestmark = pytest.mark.django_db


def _occurrence(tenant, **schedule_fields):
    run_at = timezone.now() - timedelta(seconds=1)
    make_schedule(
        tenant,
        kind=Schedule.Kind.ONE_SHOT,
        expression="",
        run_at=run_at,
        next_run_at=run_at,
        **schedule_fields,
    )
    materialize_pass(leases=leases(), now=timezone.now(), config=materialize_config())
    DispatchOutbox.objects.all().delete()
    return Occurrence.objects.get()


def test_execute_runs_the_handler_once_and_succeeds(tenant_a):
    occ = _occurrence(tenant_a, payload={"n": 1})

    summary = occurrence_execute(
        occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w1"
    )

    occ.refresh_from_db()
    assert summary == {"status": "SUCCEEDED", "attempt_no": 1}
    assert occ.state == Occurrence.State.SUCCEEDED and occ.attempt_count == 1
    attempt = Attempt.objects.get(occurrence_id=occ.id)
    assert (attempt.outcome, attempt.worker_id) == (Attempt.Outcome.SUCCEEDED, "w1")
    effect = HandlerEffect.objects.get(occurrence_id=occ.id)
    assert (effect.deliveries, effect.payload) == (1, {"n": 1})


def test_second_delivery_of_a_claimed_occurrence_is_dropped(tenant_a):
    occ = _occurrence(tenant_a)
    first = occurrence_claim(occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w1")

    second = occurrence_claim(occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w2")

    assert first.status == ClaimStatus.CLAIMED
    assert second.status == ClaimStatus.DUPLICATE
    assert Attempt.objects.filter(occurrence_id=occ.id).count() == 1


def test_completion_with_a_stale_lease_token_is_ignored(tenant_a):
    occ = _occurrence(tenant_a)
    claim = occurrence_claim(occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w1")
    # The lease was reaped meanwhile: the attempt is closed and the occurrence re-queued.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE occurrences_attempt SET finished_at = now(), outcome = 'LEASE_EXPIRED'"
        )
        cursor.execute("UPDATE occurrences_occurrence SET state = 'RETRY_WAIT'")

    assert attempt_complete(claim=claim) is None

    occ.refresh_from_db()
    assert occ.state == Occurrence.State.RETRY_WAIT


def test_a_success_for_an_occurrence_that_moved_on_writes_nothing(tenant_a):
    # given: the attempt still holds its lease, but its occurrence is no longer RUNNING
    occ = _occurrence(tenant_a)
    claim = occurrence_claim(occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w1")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE occurrences_occurrence SET state = 'RETRY_WAIT'")

    # when: its success is recorded
    assert attempt_complete(claim=claim) is None

    # then: neither the occurrence nor the attempt was written
    occ.refresh_from_db()
    attempt = Attempt.objects.get(occurrence_id=occ.id)
    assert occ.state == Occurrence.State.RETRY_WAIT and occ.finished_at is None
    assert attempt.finished_at is None and attempt.outcome == ""


def test_transient_failure_schedules_a_retry_through_the_outbox(tenant_a):
    occ = _occurrence(tenant_a)
    claim = occurrence_claim(occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w1")

    state = attempt_complete(claim=claim, error=ConnectionError("refused"))

    assert state == Occurrence.State.RETRY_WAIT
    retry = DispatchOutbox.objects.get(occurrence_id=occ.id)
    assert retry.lane == Lane.RETRY
    attempt = Attempt.objects.get(occurrence_id=occ.id)
    assert (attempt.outcome, attempt.error_class) == (Attempt.Outcome.RETRY, "ConnectionError")
    # The retry claim creates attempt 2 for the same occurrence id.
    again = occurrence_claim(occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w2")
    assert again.status == ClaimStatus.CLAIMED
    assert again.context is not None and again.context.attempt_no == 2


def test_permanent_failure_goes_dead(tenant_a):
    occ = _occurrence(tenant_a, payload={"fail": "permanent"})

    occurrence_execute(occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w1")

    occ.refresh_from_db()
    assert occ.state == Occurrence.State.DEAD
    assert not DispatchOutbox.objects.exists()


def test_occurrence_of_an_older_version_still_in_flight_runs_once(tenant_a):
    # An update recalls what it can (SUPERSEDED) and starts the new version after what it
    # could not: an old-version occurrence still claimable is the old version's instant.
    occ = _occurrence(tenant_a)
    Schedule.objects.filter(pk=occ.schedule_id).update(version=2)

    summary = occurrence_execute(
        occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w1"
    )
    again = occurrence_execute(
        occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w2"
    )

    occ.refresh_from_db()
    assert summary["status"] == Occurrence.State.SUCCEEDED
    assert again["status"] == "duplicate"
    assert occ.state == Occurrence.State.SUCCEEDED and occ.schedule_version == 1
    assert HandlerEffect.objects.get().deliveries == 1


def test_occurrence_an_update_recalled_is_dropped_not_run(tenant_a):
    occ = _occurrence(tenant_a)
    Occurrence.objects.filter(pk=occ.pk).update(state=Occurrence.State.SUPERSEDED)

    summary = occurrence_execute(
        occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w1"
    )

    occ.refresh_from_db()
    assert summary["status"] == "duplicate"
    assert occ.state == Occurrence.State.SUPERSEDED
    assert not HandlerEffect.objects.exists()


def test_retry_delay_is_full_jitter_under_the_exponential_cap():
    rng = random.Random(7)
    delays = [retry_delay(4, base_s=2, cap_s=600, rng=rng) for _ in range(2000)]
    assert all(0 <= d <= 16 for d in delays)
    assert min(delays) < 1 and max(delays) > 15  # spread over the whole [0, 2^3 * 2] range
    assert all(retry_delay(30, base_s=2, cap_s=600, rng=rng) <= 600 for _ in range(100))


def test_reaper_requeues_an_occurrence_whose_worker_died_mid_run(tenant_a):
    # given: a claim whose worker vanished (no heartbeat, no completion)
    occ = _occurrence(tenant_a)
    claim = occurrence_claim(occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w1")
    later = timezone.now() + timedelta(seconds=settings.TICK_ATTEMPT_LEASE_S + 11)

    # when
    result = attempts_reap(now=later, grace_s=10)

    # then: the attempt is closed, the occurrence waits for a retry through the outbox,
    # and the dead worker's late completion is ignored
    assert (result.expired, result.requeued, result.dead) == (1, 1, 0)
    occ.refresh_from_db()
    assert occ.state == Occurrence.State.RETRY_WAIT
    assert Attempt.objects.get(occurrence_id=occ.id).outcome == Attempt.Outcome.LEASE_EXPIRED
    assert DispatchOutbox.objects.get(occurrence_id=occ.id).lane == Lane.RETRY
    assert attempt_complete(claim=claim) is None


def test_reaper_leaves_live_leases_alone(tenant_a):
    occ = _occurrence(tenant_a)
    occurrence_claim(occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w1")

    result = attempts_reap(now=timezone.now(), grace_s=10)

    assert result.expired == 0
    occ.refresh_from_db()
    assert occ.state == Occurrence.State.RUNNING


def test_heartbeat_extends_the_lease_until_the_attempt_is_reaped(tenant_a):
    occ = _occurrence(tenant_a)
    claim = occurrence_claim(occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w1")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE occurrences_attempt SET lease_expires_at = now()")

    assert attempt_heartbeat(claim=claim).lease_held is True
    extended = Attempt.objects.get(occurrence_id=occ.id).lease_expires_at
    assert extended > timezone.now() + timedelta(seconds=settings.TICK_ATTEMPT_LEASE_S - 5)

    attempts_reap(now=extended + timedelta(seconds=11), grace_s=10)
    assert attempt_heartbeat(claim=claim).lease_held is False


def test_consecutive_runs_share_one_kept_heartbeat_thread(tenant_a):
    # given: two occurrences run one after the other, as a pool process runs them
    first = _occurrence(tenant_a)
    ran_on: list[threading.Thread] = []
    run = LeaseHeartbeat.run

    def recorded_run(self: LeaseHeartbeat) -> None:
        ran_on.append(threading.current_thread())
        run(self)

    with mock.patch.object(LeaseHeartbeat, "run", recorded_run):
        occurrence_execute(occurrence_id=first.id, scheduled_for=first.scheduled_for, worker_id="w")
        Occurrence.objects.all().delete()
        second = _occurrence(tenant_a)
        occurrence_execute(occurrence_id=second.id, scheduled_for=second.scheduled_for,
                           worker_id="w")  # fmt: skip

    # then: both succeeded, each under a heartbeat, and the same kept thread ran both
    assert Occurrence.objects.get(id=second.id).state == Occurrence.State.SUCCEEDED
    # (the thread objects, not their idents, which the OS may reuse)
    assert len(ran_on) == 2 and ran_on[0] is ran_on[1] is not threading.current_thread()
