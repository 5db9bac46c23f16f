"""Complete an attempt: step 3 of the execution path (run.py calls it after the handler).

Lock story of the completion — it may race the reaper, a cancel and a newer attempt of the
same occurrence; one transaction, row locks in this order: attempt → the tenant's retry-budget
row → occurrence → SCHEDULE advisory lock (a claim, too, holds the occurrence row before the
schedule lock, and touches no existing attempt or budget row, so no cycle):
a. Lock the attempt row only if it still holds the lease (same token, unfinished) — else the
   result is stale (the reaper or a newer attempt took over): ignored and counted.
b. Decide: SUCCEEDED; CANCELED; TIMED_OUT attempts (past the run-time limit, deadlines.py)
   count as transient failures; DEAD (permanent error, or a transient one past max attempts,
   the occurrence deadline or the tenant's hourly retry budget — a conditional upsert, so
   concurrent completions never overspend); RETRY_WAIT with a full-jitter retry row in the
   outbox, no earlier than the wait the target asked for (`requested_retry_at`).
c. The occurrence update is conditional on (RUNNING, same attempt_count); a miss rolls the
   whole completion back as stale.
d. A QUEUE_ONE completion then takes the SCHEDULE advisory lock — the one every claim of the
   schedule holds at its overlap step (claim.py, b) — and wakes the oldest WAITING occurrence
   with an outbox row due now.
A success, a cancel or a permanent failure is decided without reading anything (b needs no
lock). A success or cancel of a schedule other than QUEUE_ONE has nothing more to write: a
and c are then one statement (`_RECORD_HELD`, same lock order and fencing) without a
transaction of its own (docs/decisions.md "Claim and completion in fewer round trips").
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from apps.occurrences.alert_records import record_dead_alert
from apps.occurrences.execution.claim import Claim
from apps.occurrences.execution.deadlines import DeadlineExceeded
from apps.occurrences.execution.handlers import (
    Canceled,
    ErrorClass,
    TransientError,
    classify_error,
)
from apps.occurrences.execution.locks import SCHEDULE_LOCK, advisory_lock, overlap_lookback
from apps.occurrences.execution.requeue import OutboxTarget, requeue_through_outbox
from apps.occurrences.execution.retry_bounds import (
    Refusal,
    attempts_refusal,
    budget_refusal,
    deadline_refusal,
    spend_retry_budget,
)
from apps.occurrences.execution.statements import (
    ATTEMPT_ROW_TABLE,
    OCCURRENCE_ROW_TABLE,
    execute_prepared,
    on_row_partitions,
)
from apps.occurrences.models import Attempt, Occurrence, attempt_open_by_key
from apps.occurrences.observability import metrics
from apps.schedules.models import Schedule

_rng = random.SystemRandom()


@dataclass(frozen=True)
class _Decision:
    outcome: Attempt.Outcome
    state: Occurrence.State
    error_class: str = ""
    error_message: str = ""
    retry_at: datetime | None = None


def attempt_complete(
    *,
    claim: Claim,
    error: BaseException | None = None,
    now: datetime | None = None,
    rng: random.Random | None = None,
) -> Occurrence.State | None:
    """Record an attempt's result if it still holds its lease (module docstring, a-d);
    returns the new state, or None when the completion was stale and ignored."""
    assert claim.context is not None and claim.attempt_id is not None
    now = now or timezone.now()
    decision = _decision_without_reads(claim=claim, error=error)
    if decision is not None and not _needs_more(claim, decision):
        # One statement and nothing after it: no transaction of its own (`_RECORD_HELD`).
        with connection.cursor() as cursor:
            recorded = _record_held(cursor, claim=claim, decision=decision, now=now)
        if not recorded:
            metrics.stale_completions.inc()
            return None
        if decision.state == Occurrence.State.CANCELED:
            metrics.cancels.inc()
    else:
        with transaction.atomic(), connection.cursor() as cursor:
            if not _lock_leased_attempt(cursor, claim):
                metrics.stale_completions.inc()
                return None
            if decision is None:
                assert error is not None  # a success is always decided without reads
                decision = _retry_or_dead(
                    cursor, claim=claim, error=error, now=now, rng=rng or _rng
                )
            if not _record(cursor, claim=claim, decision=decision, now=now):
                metrics.stale_completions.inc()
                transaction.set_rollback(True)
                return None
            _after_record(cursor, claim=claim, decision=decision, now=now)
    _count_dead_streak(claim, decision.state)
    metrics.attempts_finished.labels(outcome=decision.outcome).inc()
    return decision.state


def _needs_more(claim: Claim, decision: _Decision) -> bool:
    """Whether the completion writes more than the attempt and the occurrence: a DEAD's
    alert, a QUEUE_ONE's wake-up (those keep the lease check, decision and writes as separate
    statements in one transaction)."""
    return (
        decision.state == Occurrence.State.DEAD
        or claim.overlap_policy == Schedule.OverlapPolicy.QUEUE_ONE
    )


def _after_record(
    cursor: CursorWrapper, *, claim: Claim, decision: _Decision, now: datetime
) -> None:
    """Steps b's follow-ups and d, in the completion's transaction."""
    if decision.retry_at is not None and decision.state == Occurrence.State.RETRY_WAIT:
        requeue_through_outbox(cursor, _target(claim), available_at=decision.retry_at, now=now)
        metrics.retries_scheduled.inc()
    elif decision.state == Occurrence.State.DEAD:
        ctx = claim.context
        assert ctx is not None
        record_dead_alert(cursor, occurrence_id=ctx.occurrence_id,
                          scheduled_for=ctx.scheduled_for, schedule_id=ctx.schedule_id,
                          tenant_id=ctx.tenant_id)  # fmt: skip
        metrics.dead_occurrences.inc()
    elif decision.state == Occurrence.State.CANCELED:
        metrics.cancels.inc()
    if claim.overlap_policy == Schedule.OverlapPolicy.QUEUE_ONE:
        _wake_waiting(cursor, claim=claim, now=now)


def _count_dead_streak(claim: Claim, state: Occurrence.State) -> None:
    """After the completion committed (the schedule row is never locked under the attempt and
    occurrence locks): one more consecutive DEAD, or a success ending a streak. Nothing is
    written unless the schedule pauses after DEAD runs (a DEAD) or its claim saw a streak (a
    success); the pause itself is the reaper's (apps/occurrences/failure_pause.py)."""
    assert claim.context is not None
    if state == Occurrence.State.DEAD and claim.pause_after_dead > 0:
        statement = "UPDATE schedules_schedule SET dead_streak = dead_streak + 1 WHERE id = %s"
    elif state == Occurrence.State.SUCCEEDED and claim.dead_streak > 0:
        statement = "UPDATE schedules_schedule SET dead_streak = 0 WHERE id = %s"
    else:
        return
    with connection.cursor() as cursor:
        cursor.execute(statement, [claim.context.schedule_id])


def _target(claim: Claim) -> OutboxTarget:
    assert claim.context is not None
    ctx = claim.context
    return OutboxTarget(ctx.occurrence_id, ctx.scheduled_for, ctx.schedule_id,
                        ctx.schedule_version, ctx.tenant_id, claim.shard)  # fmt: skip


def _lock_leased_attempt(cursor: CursorWrapper, claim: Claim) -> bool:
    """Step a: lock the attempt row if it still holds the lease; False = stale."""
    assert claim.context is not None
    cursor.execute(
        f"""
        SELECT 1 FROM occurrences_attempt
        WHERE id = %s AND scheduled_for = %s AND lease_token = %s AND {attempt_open_by_key()}
        FOR UPDATE
        """,
        [claim.attempt_id, claim.context.scheduled_for, claim.lease_token],
    )
    return cursor.fetchone() is not None


def _decision_without_reads(*, claim: Claim, error: BaseException | None) -> _Decision | None:
    """Step b when it needs nothing from the database: a success, a cancel or a permanent
    failure. None = a retry decision, which reads and spends the retry budget (`_decide`)."""
    assert claim.context is not None
    if error is None:
        return _Decision(Attempt.Outcome.SUCCEEDED, Occurrence.State.SUCCEEDED)
    error_class, error_message = type(error).__qualname__, str(error)[:4000]
    # The deadline sets the cancel event too; a handler it stopped timed out, and is retried.
    timed_out = isinstance(error, DeadlineExceeded)
    if not timed_out and (isinstance(error, Canceled) or claim.context.cancel_requested.is_set()):
        outcome, state = Attempt.Outcome.CANCELED, Occurrence.State.CANCELED
        return _Decision(outcome, state, error_class, error_message)
    if classify_error(error) == ErrorClass.PERMANENT:
        outcome, state = Attempt.Outcome.FAILED, Occurrence.State.DEAD
        return _Decision(outcome, state, error_class, error_message)
    return None


def _retry_or_dead(
    cursor: CursorWrapper,
    *,
    claim: Claim,
    error: BaseException,
    now: datetime,
    rng: random.Random,
) -> _Decision:
    """Step b for a failure `_decision_without_reads` left open: a retry when the policy and
    the retry budget allow one, else DEAD (reads and spends the budget, under the lock)."""
    error_class, error_message = type(error).__qualname__, str(error)[:4000]
    timed_out = isinstance(error, DeadlineExceeded)
    refused, retry_at = _retry_decision(cursor, claim=claim, error=error, now=now, rng=rng)
    if refused is not None:
        metrics.retries_refused.labels(reason=refused.reason).inc()
        message = f"{error_message[:3900]} [not retried: {refused.text}]"
        outcome = Attempt.Outcome.TIMED_OUT if timed_out else Attempt.Outcome.FAILED
        return _Decision(outcome, Occurrence.State.DEAD, error_class, message)
    outcome = Attempt.Outcome.TIMED_OUT if timed_out else Attempt.Outcome.RETRY
    return _Decision(outcome, Occurrence.State.RETRY_WAIT, error_class, error_message, retry_at)


# Steps a and c in one statement, for a decision that reads nothing: lock the attempt if it
# still holds its lease, then (only then) move the occurrence if it is still RUNNING with
# the same attempt_count, then (only then) close the attempt. Locks in complete.py's order:
# each step runs as the next one's one-time condition, so the attempt row is locked before
# the occurrence row is touched. A miss anywhere writes nothing.
_RECORD_HELD = f"""
    WITH held AS MATERIALIZED (
        SELECT 1 FROM {ATTEMPT_ROW_TABLE}
        WHERE id = %(attempt)s AND scheduled_for = %(at)s AND lease_token = %(token)s
          AND {attempt_open_by_key()}
        FOR UPDATE
    ), occurrence AS (
        UPDATE {OCCURRENCE_ROW_TABLE} SET state = %(state)s, finished_at = %(finished_at)s
        WHERE id = %(id)s AND scheduled_for = %(at)s AND state = %(running)s
          AND attempt_count = %(attempt_no)s AND EXISTS (SELECT 1 FROM held)
        RETURNING 1
    ), attempt AS (
        UPDATE {ATTEMPT_ROW_TABLE}
        SET finished_at = %(now)s, outcome = %(outcome)s, error_class = %(error_class)s,
            error_message = %(error_message)s
        WHERE id = %(attempt)s AND scheduled_for = %(at)s AND lease_token = %(token)s
          AND {attempt_open_by_key()} AND EXISTS (SELECT 1 FROM occurrence)
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM attempt)
"""


def _record_held(
    cursor: CursorWrapper, *, claim: Claim, decision: _Decision, now: datetime
) -> bool:
    """Steps a and c as `_RECORD_HELD` for a final state (success or cancel); False = stale
    (nothing written)."""
    assert claim.context is not None
    ctx = claim.context
    statement = on_row_partitions(_RECORD_HELD, ctx.scheduled_for, now)
    found = execute_prepared(cursor, statement, {
        "attempt": claim.attempt_id, "at": ctx.scheduled_for, "token": claim.lease_token,
        "id": ctx.occurrence_id, "state": decision.state, "running": Occurrence.State.RUNNING,
        "finished_at": now, "attempt_no": ctx.attempt_no, "now": now, "outcome": decision.outcome,
        "error_class": decision.error_class, "error_message": decision.error_message,
    }).fetchone()  # fmt: skip
    return bool(found and found[0])


def _record(cursor: CursorWrapper, *, claim: Claim, decision: _Decision, now: datetime) -> bool:
    """Step c: write the occurrence (conditionally) and the attempt; False = stale."""
    assert claim.context is not None
    ctx = claim.context
    finished_at = None if decision.state == Occurrence.State.RETRY_WAIT else now
    cursor.execute(
        """
        UPDATE occurrences_occurrence SET state = %s, finished_at = %s
        WHERE id = %s AND scheduled_for = %s AND state = %s AND attempt_count = %s
        """,
        [decision.state, finished_at, ctx.occurrence_id, ctx.scheduled_for,
         Occurrence.State.RUNNING, ctx.attempt_no],
    )  # fmt: skip
    if cursor.rowcount != 1:
        return False
    cursor.execute(
        f"""
        UPDATE occurrences_attempt
        SET finished_at = %s, outcome = %s, error_class = %s, error_message = %s
        WHERE id = %s AND scheduled_for = %s AND lease_token = %s AND {attempt_open_by_key()}
        """,
        [now, decision.outcome, decision.error_class, decision.error_message, claim.attempt_id,
         ctx.scheduled_for, claim.lease_token],
    )  # fmt: skip
    return True


def retry_delay(attempt_no: int, *, base_s: float, cap_s: float, rng: random.Random) -> float:
    """Exponential backoff with full jitter: uniform(0, min(cap, base * 2^(n-1)))."""
    return rng.uniform(0, min(cap_s, base_s * 2 ** (attempt_no - 1)))


def retry_deadline(*, scheduled_for: datetime, deadline_at: datetime | None) -> datetime:
    return deadline_at or scheduled_for + timedelta(seconds=settings.TICK_RETRY_DEADLINE_S)


def requested_retry_at(error: BaseException, *, now: datetime, deadline: datetime) -> datetime:
    """The earliest retry the failed target asked for (a TransientError's `retry_after_s`,
    e.g. a webhook's Retry-After), capped at the retry deadline; `now` when it asked nothing.
    Capped rather than refused: the wait is the target's hint, the deadline the tenant's bound,
    so the retry still gets its one try at the deadline."""
    wait_s = error.retry_after_s if isinstance(error, TransientError) else None
    if wait_s is None or deadline <= now:
        return now
    room_s = (deadline - now).total_seconds()
    return now + timedelta(seconds=min(max(wait_s, 0.0), room_s))


def _retry_decision(
    cursor: CursorWrapper,
    *,
    claim: Claim,
    error: BaseException,
    now: datetime,
    rng: random.Random,
) -> tuple[Refusal | None, datetime | None]:
    """(None, retry instant) for a retry, or (refusal, None) when a bound refuses it. The
    instant is the jittered backoff, or later when the target asked for a longer wait."""
    assert claim.context is not None
    ctx = claim.context
    attempts = ctx.attempt_no - claim.attempt_base
    if attempts >= settings.TICK_MAX_ATTEMPTS:
        return attempts_refusal(attempts, settings.TICK_MAX_ATTEMPTS), None
    delay = retry_delay(
        attempts, base_s=settings.TICK_RETRY_BASE_S, cap_s=settings.TICK_RETRY_CAP_S, rng=rng
    )
    deadline = retry_deadline(scheduled_for=ctx.scheduled_for, deadline_at=claim.deadline_at)
    retry_at = max(
        now + timedelta(seconds=delay), requested_retry_at(error, now=now, deadline=deadline)
    )
    if retry_at > deadline:
        return deadline_refusal(deadline), None
    if not spend_retry_budget(
        cursor, tenant_id=ctx.tenant_id, limit=claim.retry_budget_per_hour, now=now
    ):
        return budget_refusal(claim.retry_budget_per_hour), None
    return None, retry_at


def _wake_waiting(cursor: CursorWrapper, *, claim: Claim, now: datetime) -> None:
    """Step d (QUEUE_ONE): the running one left RUNNING; let the WAITING one run now."""
    assert claim.context is not None
    ctx = claim.context
    advisory_lock(cursor, SCHEDULE_LOCK, ctx.schedule_id)
    cursor.execute(
        """
        SELECT id, scheduled_for, schedule_version FROM occurrences_occurrence
        WHERE schedule_id = %s AND scheduled_for >= %s AND state = %s
        ORDER BY scheduled_for LIMIT 1
        """,
        [ctx.schedule_id, overlap_lookback(now), Occurrence.State.WAITING],
    )
    row = cursor.fetchone()
    if row is not None:
        waiting = OutboxTarget(row[0], row[1], ctx.schedule_id, row[2], ctx.tenant_id, claim.shard)
        requeue_through_outbox(cursor, waiting, available_at=now, now=now)
