"""Overlap policies, the tenant run quota, retry bounds, replay, cancel and stale workers —
at the service level against the real database, with injected clocks."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone
from prometheus_client import REGISTRY

from apps.occurrences.execution.cancel import CancelOutcome, occurrence_cancel
from apps.occurrences.execution.claim import Claim, ClaimStatus, occurrence_claim
from apps.occurrences.execution.complete import attempt_complete
from apps.occurrences.execution.handlers import TransientError
from apps.occurrences.execution.heartbeat import attempt_heartbeat
from apps.occurrences.execution.reaper import attempts_reap
from apps.occurrences.execution.replay import occurrences_replay
from apps.occurrences.execution.run import occurrence_execute
from apps.occurrences.models import Attempt, DispatchOutbox, Lane, Occurrence, RetryBudget
from apps.occurrences.tests.support.rows import occurrence, schedule, state_of
from apps.schedules.models import Schedule
from apps.tenants.tests.races import run_at_once

pytestmark = pytest.mark.clock_edge

HOUR = timedelta(hours=1)


def _claim(occ, *, now=None, worker="w"):
    return occurrence_claim(
        occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id=worker, now=now
    )


def _running(sched) -> int:
    return Occurrence.objects.filter(schedule=sched, state=Occurrence.State.RUNNING).count()


# --- overlap ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_hourly_schedule_with_two_hour_handler_skip_if_running_never_runs_two(tenant_a):
    # given: an hourly schedule whose handler takes two hours, on an injected clock
    sched = schedule(tenant_a, overlap_policy=Schedule.OverlapPolicy.SKIP_IF_RUNNING)
    t0 = timezone.now().replace(minute=0, second=0, microsecond=0) - 8 * HOUR
    occs = [occurrence(sched, t0 + h * HOUR) for h in range(7)]
    finishing: list[tuple[datetime, Claim]] = []  # (finish time, claim)
    max_running = 0

    # when: each hour, first the runs due to finish complete, then the hour's claim
    for h, occ in enumerate(occs):
        now = t0 + h * HOUR
        for done_at, claim in [f for f in finishing if f[0] <= now]:
            assert attempt_complete(claim=claim, now=done_at) == Occurrence.State.SUCCEEDED
            finishing.remove((done_at, claim))
        claim = _claim(occ, now=now)
        if claim.status == ClaimStatus.CLAIMED:
            finishing.append((now + 2 * HOUR, claim))
        max_running = max(max_running, _running(sched))

    # then: never two RUNNING; every other hour is SKIPPED_OVERLAP (final, not retried)
    assert max_running == 1
    assert [state_of(o) for o in occs] == [
        "SUCCEEDED", "SKIPPED_OVERLAP", "SUCCEEDED", "SKIPPED_OVERLAP", "SUCCEEDED",
        "SKIPPED_OVERLAP", "RUNNING",
    ]  # fmt: skip
    assert not DispatchOutbox.objects.exists()


@pytest.mark.django_db
def test_skip_if_running_delays_a_retry_instead_of_dropping_it(tenant_a):
    sched = schedule(tenant_a, overlap_policy=Schedule.OverlapPolicy.SKIP_IF_RUNNING)
    t0 = timezone.now() - 3 * HOUR
    first, second = occurrence(sched, t0), occurrence(sched, t0 + HOUR)
    attempt_complete(claim=_claim(first, now=t0), error=TransientError("503"), now=t0)
    DispatchOutbox.objects.all().delete()
    _claim(second, now=t0 + HOUR)  # runs while the first waits for its retry

    retry = _claim(first, now=t0 + HOUR)

    assert retry.status == ClaimStatus.DELAYED
    assert state_of(first) == "RETRY_WAIT"
    assert DispatchOutbox.objects.get(occurrence_id=first.id).lane == Lane.RETRY


@pytest.mark.django_db
def test_queue_one_keeps_at_most_one_waiting_and_runs_it_when_the_running_one_ends(tenant_a):
    # given: a QUEUE_ONE schedule with one running occurrence
    sched = schedule(tenant_a, overlap_policy=Schedule.OverlapPolicy.QUEUE_ONE)
    t0 = timezone.now() - 5 * HOUR
    occs = [occurrence(sched, t0 + h * HOUR) for h in range(4)]
    running = _claim(occs[0], now=t0)

    # when: three more come due while it runs
    statuses = [_claim(o, now=t0 + (i + 1) * HOUR).status for i, o in enumerate(occs[1:])]

    # then: one waits (with a re-check row in the outbox), the others are skipped
    assert statuses == [
        ClaimStatus.WAITING,
        ClaimStatus.SKIPPED_OVERLAP,
        ClaimStatus.SKIPPED_OVERLAP,
    ]
    assert [state_of(o) for o in occs] == [
        "RUNNING",
        "WAITING",
        "SKIPPED_OVERLAP",
        "SKIPPED_OVERLAP",
    ]
    recheck = DispatchOutbox.objects.get(occurrence_id=occs[1].id)
    DispatchOutbox.objects.all().delete()

    # when: the running one finishes, the waiting one is woken through the outbox, now
    finished_at = t0 + 4 * HOUR
    assert attempt_complete(claim=running, now=finished_at) == Occurrence.State.SUCCEEDED
    wake = DispatchOutbox.objects.get(occurrence_id=occs[1].id)
    assert (wake.lane, wake.available_at) == (Lane.RETRY, finished_at)
    assert recheck.available_at > recheck.created_at

    # then: it runs
    assert _claim(occs[1], now=finished_at).status == ClaimStatus.CLAIMED
    assert _running(sched) == 1


@pytest.mark.django_db
def test_queue_one_waiting_occurrence_rechecks_while_the_run_goes_on(tenant_a):
    sched = schedule(tenant_a, overlap_policy=Schedule.OverlapPolicy.QUEUE_ONE)
    t0 = timezone.now() - 2 * HOUR
    first, second = occurrence(sched, t0), occurrence(sched, t0 + HOUR)
    _claim(first, now=t0)
    _claim(second, now=t0 + HOUR)
    DispatchOutbox.objects.all().delete()

    again = _claim(second, now=t0 + HOUR + timedelta(seconds=30))

    assert again.status == ClaimStatus.WAITING
    assert state_of(second) == "WAITING"
    assert DispatchOutbox.objects.filter(occurrence_id=second.id).count() == 1


# --- tenant run quota -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrency_quota_holds_under_a_burst(tenant_a):
    # given: a tenant allowed 3 running occurrences and a burst of 12 due at once
    tenant_a.max_running = 3
    tenant_a.save(update_fields=["max_running"])
    now = timezone.now()
    occs = [occurrence(schedule(tenant_a, name=f"s{i}"), now) for i in range(12)]

    # when: 12 workers claim at the same moment
    statuses = run_at_once(len(occs), lambda i: _claim(occs[i], now=now, worker=f"h:{i}").status)

    # then: exactly 3 run; 9 are delayed through the retry lane, none failed
    assert statuses.count(ClaimStatus.CLAIMED) == 3
    assert statuses.count(ClaimStatus.DELAYED) == 9
    assert Attempt.objects.filter(tenant=tenant_a, finished_at__isnull=True).count() == 3
    delayed = DispatchOutbox.objects.filter(tenant_id=tenant_a.id)
    assert delayed.count() == 9 and {d.lane for d in delayed} == {Lane.RETRY}
    # fresh arrivals ask again after 4-8 s (twice the base: deferred ones go first)
    assert all(now + timedelta(seconds=4) <= d.available_at <= now + timedelta(seconds=8)
               for d in delayed)  # fmt: skip
    assert not Occurrence.objects.filter(state__in=["DEAD", "SKIPPED_OVERLAP"]).exists()


def _quota_delays() -> float:
    return REGISTRY.get_sample_value("tick_quota_delayed_total") or 0.0


@pytest.mark.django_db
def test_a_slot_held_by_another_worker_counts_against_max_running(tenant_a):
    # given: a tenant allowed 1 running occurrence, running one on worker h:1
    tenant_a.max_running = 1
    tenant_a.save(update_fields=["max_running"])
    now = timezone.now()
    held, fresh = (occurrence(schedule(tenant_a, name=f"s{i}"), now) for i in range(2))
    assert _claim(held, now=now, worker="h:1").status == ClaimStatus.CLAIMED
    before = _quota_delays()

    # when: another pool process claims the tenant's next occurrence
    claim = _claim(fresh, now=now, worker="h:2")

    # then: h:1's slot is the tenant's one: delayed by the quota
    assert claim.status == ClaimStatus.DELAYED
    assert _quota_delays() - before == 1


@pytest.mark.parametrize(("max_running", "expected"), [
    (2, ClaimStatus.CLAIMED), (1, ClaimStatus.DELAYED),
])  # fmt: skip
@pytest.mark.django_db
def test_max_running_counts_worker_slots_not_open_attempts(tenant_a, max_running, expected):
    # given: two open attempts of the tenant held by one pool process, h:1 (an envelope
    # run: docs/decisions.md "A tenant's running work counted in worker slots")
    now = timezone.now()
    held = [occurrence(schedule(tenant_a, name=f"s{i}"), now) for i in range(2)]
    assert [_claim(o, now=now, worker="h:1").status for o in held] == [ClaimStatus.CLAIMED] * 2
    assert Attempt.objects.filter(tenant=tenant_a, finished_at__isnull=True).count() == 2
    tenant_a.max_running = max_running
    tenant_a.save(update_fields=["max_running"])
    before = _quota_delays()

    # when: another pool process claims the tenant's next occurrence
    claim = _claim(occurrence(schedule(tenant_a, name="next"), now), now=now, worker="h:2")

    # then: one slot is held; a second is free under max_running 2, none under 1
    assert claim.status == expected
    assert _quota_delays() - before == (1 if expected == ClaimStatus.DELAYED else 0)


# --- retries by error class, bounds, replay ----------------------------------------------


@pytest.mark.django_db
def test_transient_failures_retry_inside_full_jitter_bounds_then_dead_then_replay(
    tenant_a, settings
):
    settings.TICK_MAX_ATTEMPTS, settings.TICK_RETRY_BASE_S = 4, 10
    sched = schedule(tenant_a, payload={"fail": "transient", "fail_attempts": 4})
    occ = occurrence(sched, timezone.now() - timedelta(minutes=1))
    delays = []
    for attempt_no in range(1, 5):
        # when: attempt n fails transiently
        now = timezone.now()
        summary = occurrence_execute(
            occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w"
        )
        assert summary["attempt_no"] == attempt_no
        if attempt_no < 4:
            # then: a retry row in the retry lane, within [0, base * 2^(n-1)] of the failure
            assert summary["status"] == "RETRY_WAIT"
            row = DispatchOutbox.objects.get(occurrence_id=occ.id)
            delay = (row.available_at - now).total_seconds()
            assert row.lane == Lane.RETRY
            assert -0.5 <= delay <= 10 * 2 ** (attempt_no - 1) + 0.5, (attempt_no, delay)
            delays.append(delay)
            row.delete()
    # then: the 4th failure exhausts the attempts: DEAD, no retry row, reason recorded
    assert state_of(occ) == "DEAD"
    assert not DispatchOutbox.objects.exists()
    last = Attempt.objects.get(occurrence_id=occ.id, attempt_no=4)
    assert last.outcome == Attempt.Outcome.FAILED
    assert "attempts exhausted (4 of 4)" in last.error_message

    # when: replayed from the DLQ
    result = occurrences_replay(tenant_id=tenant_a.id, occurrence_ids=[occ.id])

    # then: same id, RETRY_WAIT with a retry row due now, fresh attempt budget; it succeeds
    assert result.replayed == [occ.id]
    occ.refresh_from_db()
    assert (occ.state, occ.attempt_base, occ.finished_at) == ("RETRY_WAIT", 4, None)
    assert DispatchOutbox.objects.get(occurrence_id=occ.id).lane == Lane.RETRY
    summary = occurrence_execute(
        occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w"
    )
    assert summary == {"status": "SUCCEEDED", "attempt_no": 5}
    assert Occurrence.objects.filter(id=occ.id).count() == 1
    assert list(
        Attempt.objects.filter(occurrence_id=occ.id)
        .order_by("attempt_no")
        .values_list("outcome", flat=True)
    ) == ["RETRY", "RETRY", "RETRY", "FAILED", "SUCCEEDED"]


@pytest.mark.django_db
def test_replay_refuses_occurrences_that_are_not_dead_and_other_tenants_ids(tenant_a, tenant_b):
    mine = occurrence(schedule(tenant_a), timezone.now(), state=Occurrence.State.SUCCEEDED)
    theirs = occurrence(schedule(tenant_b), timezone.now(), state=Occurrence.State.DEAD)

    result = occurrences_replay(tenant_id=tenant_a.id, occurrence_ids=[mine.id, theirs.id])

    assert result.replayed == []
    assert result.not_dead == {mine.id: "SUCCEEDED"}
    assert result.not_found == [theirs.id]
    assert state_of(theirs) == "DEAD" and not DispatchOutbox.objects.exists()


@pytest.mark.django_db
def test_permanent_error_goes_dead_at_once(tenant_a):
    occ = occurrence(schedule(tenant_a, payload={"fail": "permanent"}), timezone.now())

    summary = occurrence_execute(
        occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w"
    )

    assert summary == {"status": "DEAD", "attempt_no": 1}
    assert not DispatchOutbox.objects.exists()


@pytest.mark.django_db
def test_retry_past_the_occurrence_deadline_goes_dead(tenant_a, settings):
    settings.TICK_RETRY_DEADLINE_S = 60
    occ = occurrence(schedule(tenant_a), timezone.now() - timedelta(minutes=5))
    claim = _claim(occ)

    assert attempt_complete(claim=claim, error=TimeoutError("read timeout")) == "DEAD"
    assert "deadline" in Attempt.objects.get(occurrence_id=occ.id).error_message


@pytest.mark.django_db
def test_tenant_retry_budget_bounds_retries(tenant_a):
    tenant_a.retry_budget_per_hour = 2
    tenant_a.save(update_fields=["retry_budget_per_hour"])
    sched = schedule(tenant_a)
    occs = [occurrence(sched, timezone.now() - timedelta(minutes=m)) for m in (1, 2, 3)]

    states = [attempt_complete(claim=_claim(o), error=ConnectionError("reset")) for o in occs]

    assert states == ["RETRY_WAIT", "RETRY_WAIT", "DEAD"]
    assert RetryBudget.objects.get(tenant_id=tenant_a.id).used == 2
    assert (
        "budget of 2 retries/hour spent"
        in Attempt.objects.get(occurrence_id=occs[2].id).error_message
    )


def _refused(reason: str) -> float:
    return REGISTRY.get_sample_value("tick_retries_refused_total", {"reason": reason}) or 0.0


@pytest.mark.django_db
def test_reaper_requeues_spend_the_retry_budget(tenant_a, settings):
    # given: a tenant with 2 retries an hour and 3 runs whose workers vanished; the reaper's
    # clock is lease + 11 s ahead, and the last completion is given that same clock, so the
    # budget hour is one even when an hour turns during the test (docs/testing.md)
    tenant_a.retry_budget_per_hour = 2
    tenant_a.save(update_fields=["retry_budget_per_hour"])
    sched = schedule(tenant_a)
    occs = [occurrence(sched, timezone.now() - timedelta(minutes=m)) for m in (3, 2, 1)]
    for occ in occs:
        _claim(occ)
    refused_before = _refused("budget")
    later = timezone.now() + timedelta(seconds=settings.TICK_ATTEMPT_LEASE_S + 11)

    # when: the reaper takes their expired leases back
    result = attempts_reap(now=later, grace_s=10)

    # then: two re-queues spend the budget, the third goes DEAD for the budget, like a retry
    assert (result.expired, result.requeued, result.dead) == (3, 2, 1)
    assert [state_of(o) for o in occs] == ["RETRY_WAIT", "RETRY_WAIT", "DEAD"]
    assert RetryBudget.objects.get(tenant_id=tenant_a.id).used == 2
    assert DispatchOutbox.objects.filter(occurrence_id__in=[o.id for o in occs]).count() == 2
    error = Attempt.objects.get(occurrence_id=occs[2].id).error_message
    assert "[not retried: budget of 2 retries/hour spent]" in error
    assert _refused("budget") == refused_before + 1

    # and: a failure's retry in the same hour finds the budget spent too
    occ = occurrence(sched, timezone.now())
    assert attempt_complete(claim=_claim(occ), error=ConnectionError("reset"), now=later) == "DEAD"


# --- cancel -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_running_occurrence_is_canceled_cooperatively(tenant_a, settings):
    # given: a handler that sleeps 30 s, and a heartbeat every 0.1 s
    settings.TICK_ATTEMPT_LEASE_S = 0.3
    occ = occurrence(schedule(tenant_a, payload={"sleep_s": 30}), timezone.now())

    def cancel_soon():
        try:
            while state_of(occ) != "RUNNING":
                time.sleep(0.02)
            assert occurrence_cancel(tenant_id=tenant_a.id, occurrence_id=occ.id) == (
                CancelOutcome.REQUESTED
            )
        finally:
            connection.close()

    canceler = threading.Thread(target=cancel_soon)
    canceler.start()
    started = time.monotonic()

    # when
    summary = occurrence_execute(
        occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w"
    )
    canceler.join()

    # then: the handler stopped early, the occurrence is CANCELED, not retried
    assert time.monotonic() - started < 5
    assert summary == {"status": "CANCELED", "attempt_no": 1}
    assert Attempt.objects.get(occurrence_id=occ.id).outcome == Attempt.Outcome.CANCELED
    assert not DispatchOutbox.objects.exists()


@pytest.mark.django_db
def test_heartbeat_reports_a_canceled_schedule(tenant_a):
    sched = schedule(tenant_a)
    occ = occurrence(sched, timezone.now())
    claim = _claim(occ)
    assert attempt_heartbeat(claim=claim).cancel_requested is False

    Schedule.objects.filter(pk=sched.pk).update(state=Schedule.State.CANCELED)

    assert attempt_heartbeat(claim=claim).cancel_requested is True


@pytest.mark.django_db
def test_cancel_of_a_pending_occurrence_is_final_at_once(tenant_a):
    occ = occurrence(schedule(tenant_a), timezone.now())

    assert occurrence_cancel(tenant_id=tenant_a.id, occurrence_id=occ.id) == CancelOutcome.CANCELED
    assert _claim(occ).status == ClaimStatus.DUPLICATE
    assert occurrence_cancel(tenant_id=tenant_a.id, occurrence_id=occ.id) == CancelOutcome.FINAL


# --- races and stale workers ------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_claims_exactly_one_wins(tenant_a):
    occ = occurrence(schedule(tenant_a), timezone.now())

    statuses = run_at_once(2, lambda i: _claim(occ, worker=f"w{i + 1}").status)

    assert sorted(statuses) == [ClaimStatus.CLAIMED, ClaimStatus.DUPLICATE]
    assert Attempt.objects.filter(occurrence_id=occ.id).count() == 1


@pytest.mark.django_db
def test_stopped_worker_resumed_after_a_newer_attempt_finished_cannot_overwrite_it(
    tenant_a, settings
):
    # given: worker 1 claims, then is frozen (SIGSTOP) past its lease; the reaper requeues
    occ = occurrence(schedule(tenant_a), timezone.now())
    frozen = _claim(occ, worker="w1")
    later = timezone.now() + timedelta(seconds=settings.TICK_ATTEMPT_LEASE_S + 11)
    assert attempts_reap(now=later, grace_s=10).requeued == 1
    # worker 2 runs the retry to success
    newer = _claim(occ, worker="w2", now=later)
    assert attempt_complete(claim=newer, now=later) == Occurrence.State.SUCCEEDED

    # when: worker 1 resumes and reports, as success or as failure
    assert attempt_heartbeat(claim=frozen).lease_held is False
    stale_ok = attempt_complete(claim=frozen)
    stale_err = attempt_complete(claim=frozen, error=TransientError("late"))

    # then: both are ignored; the newer result stands
    assert (stale_ok, stale_err) == (None, None)
    occ.refresh_from_db()
    assert (occ.state, occ.attempt_count) == ("SUCCEEDED", 2)
    outcomes = dict(
        Attempt.objects.filter(occurrence_id=occ.id).values_list("attempt_no", "outcome")
    )
    assert outcomes == {1: Attempt.Outcome.LEASE_EXPIRED, 2: Attempt.Outcome.SUCCEEDED}
    assert DispatchOutbox.objects.filter(occurrence_id=occ.id).count() == 1  # the reaper's


@pytest.mark.django_db
def test_stopped_worker_resumed_while_the_newer_attempt_runs_cannot_finish_it(tenant_a, settings):
    occ = occurrence(schedule(tenant_a), timezone.now())
    frozen = _claim(occ, worker="w1")
    later = timezone.now() + timedelta(seconds=settings.TICK_ATTEMPT_LEASE_S + 11)
    attempts_reap(now=later, grace_s=10)
    newer = _claim(occ, worker="w2", now=later)

    assert attempt_complete(claim=frozen) is None

    assert state_of(occ) == "RUNNING"
    assert attempt_complete(claim=newer) == Occurrence.State.SUCCEEDED
