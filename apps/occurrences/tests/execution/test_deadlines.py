"""Handler deadlines (apps/occurrences/execution/deadlines.py): the limit a claim hands the
handler, the stop at the limit, the hard stop past the grace, and what a TIMED_OUT attempt
becomes. The slot tests run a real Celery worker and relay on RabbitMQ and PostgreSQL."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from apps.occurrences.execution.claim import ClaimStatus, occurrence_claim
from apps.occurrences.execution.complete import attempt_complete
from apps.occurrences.execution.deadlines import DeadlineExceeded
from apps.occurrences.execution.reaper import attempts_reap
from apps.occurrences.execution.requeue import OutboxTarget, requeue_through_outbox
from apps.occurrences.execution.run import occurrence_execute
from apps.occurrences.models import Attempt, DispatchOutbox, HandlerEffect, Lane, Occurrence
from apps.occurrences.tests.support.processes import ProcessStack, shared_stack_env
from apps.occurrences.tests.support.rows import occurrence, schedule, state_of
from apps.tenants.models import Tenant

pytestmark = pytest.mark.clock_edge

GRACE_S = 3
SLEEPS_FOR_GOOD = {"sleep_s": 600, "sleep_attempts": 1}


class _LongestBackoff(random.Random):
    """Full jitter at its upper end: the retry lands as late as the backoff allows."""

    def uniform(self, a: float, b: float) -> float:
        return b


def _claim(occ: Occurrence, worker_id: str = "w1", **kwargs: Any) -> Any:
    return occurrence_claim(
        occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id=worker_id, **kwargs
    )


def _execute(occ: Occurrence) -> dict[str, Any]:
    return occurrence_execute(occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w1")


def _attempts(occ: Occurrence) -> list[Attempt]:
    return list(Attempt.objects.filter(occurrence_id=occ.id).order_by("attempt_no"))


def _pid(attempt: Attempt) -> int:
    return int(attempt.worker_id.rsplit(":", 1)[1])


def _ran_for(attempt: Attempt) -> float:
    assert attempt.finished_at is not None, "the attempt is still open"
    return (attempt.finished_at - attempt.started_at).total_seconds()


# --- the limit -----------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("handler", "timeout_s", "tenant_max_s", "expected_s"),
    [
        ("record", None, None, 60),  # the handler's default
        ("noop", None, None, 10),
        ("record", 5, None, 5),  # the schedule's own limit
        ("record", 600, 120, 120),  # capped by a tenant maximum lowered after the fact
        ("record", None, 30, 30),  # a default above the maximum is capped too
    ],
)
def test_claim_hands_the_handler_its_limit(tenant_a, handler, timeout_s, tenant_max_s, expected_s):
    occ = occurrence(schedule(tenant_a, handler=handler, timeout_s=timeout_s), timezone.now())
    if tenant_max_s is not None:
        Tenant.objects.filter(pk=tenant_a.pk).update(max_timeout_s=tenant_max_s)

    claim = _claim(occ)

    assert claim.status == ClaimStatus.CLAIMED
    assert claim.context.timeout_s == expected_s


# --- the stop at the limit, in process -------------------------------------------------------


@pytest.mark.django_db
def test_handler_that_stops_at_its_limit_ends_timed_out_and_is_retried(tenant_a, settings):
    settings.TICK_HANDLER_TIMEOUT_GRACE_S = 30
    occ = occurrence(schedule(tenant_a, timeout_s=1, payload=SLEEPS_FOR_GOOD), timezone.now())

    started = time.monotonic()
    summary = _execute(occ)
    ran_for = time.monotonic() - started

    assert summary == {"status": "RETRY_WAIT", "attempt_no": 1}
    assert 1 <= ran_for < 5  # the cancel event woke it: no wait for the grace
    [attempt] = _attempts(occ)
    assert (attempt.outcome, attempt.error_class) == (Attempt.Outcome.TIMED_OUT, "DeadlineExceeded")
    assert "1 s run-time limit" in attempt.error_message
    assert DispatchOutbox.objects.get(occurrence_id=occ.id).lane == Lane.RETRY


@pytest.mark.django_db
def test_handler_that_returns_within_the_grace_succeeded(tenant_a, settings):
    # It ignored the cancel event but finished its work: a retry would only repeat it.
    settings.TICK_HANDLER_TIMEOUT_GRACE_S = 30
    payload = {"sleep_s": 1.5, "ignore_cancel": True}
    occ = occurrence(schedule(tenant_a, timeout_s=1, payload=payload), timezone.now())

    summary = _execute(occ)

    assert summary["status"] == "SUCCEEDED"
    assert [a.outcome for a in _attempts(occ)] == [Attempt.Outcome.SUCCEEDED]


@pytest.mark.django_db(transaction=True)
def test_hard_stop_outside_a_pool_process_records_timed_out_and_ignores_the_late_result(
    tenant_a, settings
):
    # pytest is no prefork pool process: the stuck thread cannot be ended, only recorded.
    settings.TICK_HANDLER_TIMEOUT_GRACE_S = 1
    payload = {"sleep_s": 3, "ignore_cancel": True}
    occ = occurrence(schedule(tenant_a, timeout_s=1, payload=payload), timezone.now())

    summary = _execute(occ)

    assert summary["status"] == "stale"  # TIMED_OUT was written at 2 s, under the lease
    [attempt] = _attempts(occ)
    assert attempt.outcome == Attempt.Outcome.TIMED_OUT
    assert "reclaimed" in attempt.error_message
    assert 2 <= _ran_for(attempt) < 3
    assert state_of(occ) == Occurrence.State.RETRY_WAIT


# --- what a TIMED_OUT attempt becomes ----------------------------------------------------------


@pytest.mark.django_db
def test_timed_out_attempt_with_no_retry_left_goes_dead(tenant_a, settings):
    settings.TICK_MAX_ATTEMPTS = 1
    occ = occurrence(schedule(tenant_a, timeout_s=1), timezone.now())

    state = attempt_complete(claim=_claim(occ), error=DeadlineExceeded("limit"))

    assert state == Occurrence.State.DEAD
    [attempt] = _attempts(occ)
    assert attempt.outcome == Attempt.Outcome.TIMED_OUT
    assert "not retried: attempts exhausted" in attempt.error_message
    assert not DispatchOutbox.objects.filter(occurrence_id=occ.id).exists()


@pytest.mark.django_db
def test_reaper_leaves_a_timed_out_attempt_alone(tenant_a):
    occ = occurrence(schedule(tenant_a, timeout_s=1), timezone.now())
    attempt_complete(claim=_claim(occ), error=DeadlineExceeded("limit"))
    long_after_the_lease = timezone.now() + timedelta(seconds=settings.TICK_ATTEMPT_LEASE_S * 10)

    result = attempts_reap(now=long_after_the_lease, grace_s=0)

    assert result.expired == 0
    assert [a.outcome for a in _attempts(occ)] == [Attempt.Outcome.TIMED_OUT]
    assert state_of(occ) == Occurrence.State.RETRY_WAIT
    assert DispatchOutbox.objects.filter(occurrence_id=occ.id).count() == 1


@pytest.mark.django_db
def test_reclaimed_attempts_own_message_is_dropped_while_its_retry_waits(tenant_a, settings):
    # given: attempt 1 timed out; its retry is due 10 s later (the pool process was replaced,
    # so the broker hands attempt 1's message back at once)
    settings.TICK_RETRY_BASE_S = 10
    occ = occurrence(schedule(tenant_a, timeout_s=1), timezone.now())
    now = timezone.now()
    attempt_complete(
        claim=_claim(occ), error=DeadlineExceeded("reclaimed"), now=now, rng=_LongestBackoff()
    )
    retry = DispatchOutbox.objects.get(occurrence_id=occ.id)
    assert retry.available_at == now + timedelta(seconds=10)

    # when: the handed-back message arrives now, and the retry's own when it is due
    early = _claim(occ, worker_id="w2", now=now + timedelta(seconds=1))
    on_time = _claim(occ, worker_id="w3", now=retry.available_at)

    # then: the first is a duplicate; the retry runs as attempt 2
    assert early.status == ClaimStatus.DUPLICATE
    assert on_time.status == ClaimStatus.CLAIMED and on_time.context.attempt_no == 2
    assert [a.worker_id for a in _attempts(occ)] == ["w1", "w3"]


# --- worker slots, with real processes ---------------------------------------------------------


@pytest.fixture
def one_slot(queue_prefix: str, tmp_path: Path) -> Iterator[ProcessStack]:
    """A relay and a Celery worker with a single prefork slot; short leases and grace."""
    env = shared_stack_env(
        queue_prefix,
        TICK_ATTEMPT_LEASE_S="2",
        TICK_LEASE_TTL_S="3",
        TICK_HANDLER_TIMEOUT_GRACE_S=str(GRACE_S),
        TICK_RETRY_BASE_S="3",
    )
    stack = ProcessStack(tmp_path, env)
    stack.start_role("worker", concurrency=1)
    stack.start_role("relay")
    yield stack
    stack.stop_all()


def _due_now(tenant: Tenant, **schedule_fields: Any) -> Occurrence:
    """An occurrence of a new schedule, with an outbox row due now: the relay publishes it."""
    sched = schedule(tenant, **schedule_fields)
    occ = occurrence(sched, timezone.now(), state=Occurrence.State.SCHEDULED)
    target = OutboxTarget(
        occ.id, occ.scheduled_for, sched.id, sched.version, tenant.id, sched.shard
    )
    with connection.cursor() as cursor:
        requeue_through_outbox(cursor, target, available_at=timezone.now(), now=timezone.now())
    return occ


def _wait(predicate: Callable[[], Any], timeout_s: float, what: str, stack: ProcessStack) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        stack.assert_alive()
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def _first_attempt_running(occ: Occurrence, stack: ProcessStack) -> Attempt:
    started: list[Attempt] = _wait(lambda: _attempts(occ)[:1], 60, "attempt 1 to start", stack)
    return started[0]


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_handler_past_its_deadline_ends_timed_out_and_frees_its_slot_for_another_tenant(
    tenant_a, tenant_b, one_slot
):
    # given: tenant A's handler holds the only slot and would sleep 10 minutes; its limit 2 s
    runaway = _due_now(tenant_a, timeout_s=2, payload=SLEEPS_FOR_GOOD)
    first = _first_attempt_running(runaway, one_slot)
    quiet = _due_now(tenant_b, payload={"quiet": True})

    # when: the limit passes
    _wait(lambda: state_of(quiet) == Occurrence.State.SUCCEEDED, 30, "B to run", one_slot)

    # then: A's attempt ended TIMED_OUT when asked to stop, and only then did B start
    first.refresh_from_db()
    assert (first.outcome, first.error_class) == (Attempt.Outcome.TIMED_OUT, "DeadlineExceeded")
    ran_for = _ran_for(first)
    assert 2 <= ran_for < 2 + GRACE_S, ran_for  # the cancel event, not the hard stop
    [quiet_attempt] = _attempts(quiet)
    assert quiet_attempt.started_at >= first.started_at + timedelta(seconds=ran_for)
    # and A is retried under the usual policy, in the same pool process
    _wait(lambda: state_of(runaway) == Occurrence.State.SUCCEEDED, 30, "A's retry", one_slot)
    attempts = _attempts(runaway)
    assert [a.outcome for a in attempts] == [Attempt.Outcome.TIMED_OUT, Attempt.Outcome.SUCCEEDED]
    assert _pid(attempts[1]) == _pid(first)


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_hard_stuck_handler_is_reclaimed_its_process_replaced_and_retried_once(
    tenant_a, tenant_b, one_slot
):
    # given: tenant A's handler holds the only slot and ignores the cancel event; limit 1 s
    stuck = _due_now(tenant_a, timeout_s=1, payload={**SLEEPS_FOR_GOOD, "ignore_cancel": True})
    first = _first_attempt_running(stuck, one_slot)
    stuck_pid = _pid(first)
    quiet = _due_now(tenant_b, payload={"quiet": True})

    # when: limit + grace pass
    _wait(lambda: state_of(quiet) == Occurrence.State.SUCCEEDED, 40, "B to run", one_slot)

    # then: the attempt was written TIMED_OUT at limit + grace and its process replaced
    first.refresh_from_db()
    assert first.outcome == Attempt.Outcome.TIMED_OUT and "reclaimed" in first.error_message
    ran_for = _ran_for(first)
    assert 1 + GRACE_S <= ran_for < 1 + GRACE_S + 2, ran_for
    _wait(lambda: _process_gone(stuck_pid), 10, "the stuck pool process to end", one_slot)
    [quiet_attempt] = _attempts(quiet)
    assert _pid(quiet_attempt) != stuck_pid
    assert quiet_attempt.started_at >= first.started_at + timedelta(seconds=ran_for)
    # and A's retry ran once: the message the broker handed back was dropped at claim
    _wait(lambda: state_of(stuck) == Occurrence.State.SUCCEEDED, 30, "A's retry", one_slot)
    dropped = f"occurrence {stuck.id} not run: duplicate"
    _wait(lambda: dropped in one_slot.log_text("worker"), 15, "the duplicate drop", one_slot)
    assert [a.outcome for a in _attempts(stuck)] == [
        Attempt.Outcome.TIMED_OUT,
        Attempt.Outcome.SUCCEEDED,
    ]
    assert HandlerEffect.objects.get(occurrence_id=stuck.id).deliveries == 2
