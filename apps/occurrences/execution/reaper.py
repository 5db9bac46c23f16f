"""Take back attempts whose worker is gone: step 4 of the execution path (`manage.py reap`).

Lock story of the reaper — it may run in several processes at once, and concurrently with
claims, heartbeats and completions; one set-based statement in one transaction:
- expired attempts are locked FOR UPDATE SKIP LOCKED, so the reaper never waits for a
  completion or a heartbeat in flight (that row is looked at again next pass) and two reapers
  never take the same attempt;
- the occurrence update is conditional on (RUNNING, same attempt_count), like a completion's
  (complete.py, c): whichever of the two commits first wins, the other changes nothing;
- RUNNING past lease + grace → RETRY_WAIT with a retry-lane outbox row due now, or DEAD when
  the attempts or the deadline are exhausted. A QUEUE_ONE occurrence WAITING behind a reaped
  one runs at its next re-check (claim.py, b).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from apps.occurrences.execution.requeue import REQUEUED_TO_OUTBOX
from apps.occurrences.models import Attempt, Lane, Occurrence
from apps.occurrences.observability import metrics

_REAP = (
    """
    WITH expired AS (
        UPDATE occurrences_attempt a
        SET finished_at = %(now)s, outcome = %(lease_expired)s,
            error_class = 'LeaseExpired',
            error_message = 'no heartbeat before the lease expired (worker lost?)'
        WHERE (a.id, a.scheduled_for) IN (
            SELECT id, scheduled_for FROM occurrences_attempt
            WHERE finished_at IS NULL AND lease_expires_at < %(cutoff)s
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED
        )
        RETURNING a.occurrence_id, a.scheduled_for, a.attempt_no
    ),
    requeued AS (
        UPDATE occurrences_occurrence o
        SET state = CASE
                WHEN e.attempt_no - o.attempt_base >= %(max_attempts)s
                  OR %(now)s > COALESCE(o.deadline_at,
                                        o.scheduled_for + make_interval(secs => %(deadline_s)s))
                THEN %(dead)s ELSE %(retry_wait)s END,
            finished_at = CASE
                WHEN e.attempt_no - o.attempt_base >= %(max_attempts)s
                  OR %(now)s > COALESCE(o.deadline_at,
                                        o.scheduled_for + make_interval(secs => %(deadline_s)s))
                THEN %(now)s END
        FROM expired e
        WHERE o.id = e.occurrence_id AND o.scheduled_for = e.scheduled_for
          AND o.state = %(running)s AND o.attempt_count = e.attempt_no
        RETURNING o.id, o.scheduled_for, o.schedule_id, o.schedule_version, o.tenant_id, o.state
    ),
    outbox AS ("""
    + REQUEUED_TO_OUTBOX
    + """
        WHERE r.state = %(retry_wait)s
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM expired), (SELECT count(*) FROM outbox),
           (SELECT count(*) FROM requeued WHERE state = %(dead)s)
"""
)


@dataclass(frozen=True)
class ReapResult:
    expired: int
    requeued: int
    dead: int


def attempts_reap(*, now: datetime, grace_s: int, limit: int = 1000) -> ReapResult:
    """Close attempts whose lease expired more than `grace_s` ago and send their occurrences
    back through the outbox (retry lane), set-based and in one transaction.

    This is what saves an occurrence whose worker died after the broker considered the
    message handled (e.g. a pool child killed by the OOM killer is acknowledged by Celery,
    or its redelivery is dropped at claim because the occurrence still looks RUNNING).
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            _REAP,
            {
                "now": now,
                "cutoff": now - timedelta(seconds=grace_s),
                "limit": limit,
                "max_attempts": settings.TICK_MAX_ATTEMPTS,
                "deadline_s": settings.TICK_RETRY_DEADLINE_S,
                "lease_expired": Attempt.Outcome.LEASE_EXPIRED,
                "running": Occurrence.State.RUNNING,
                "retry_wait": Occurrence.State.RETRY_WAIT,
                "dead": Occurrence.State.DEAD,
                "retry_lane": Lane.RETRY,
            },
        )
        row = cursor.fetchone()
        # Retry budgets of past hours are no longer read.
        cursor.execute(
            "DELETE FROM occurrences_retrybudget WHERE window_start < %s",
            [now - timedelta(hours=2)],
        )
    assert row is not None
    result = ReapResult(int(row[0]), int(row[1]), int(row[2]))
    metrics.attempts_finished.labels(outcome=Attempt.Outcome.LEASE_EXPIRED).inc(result.expired)
    metrics.retries_scheduled.inc(result.requeued)
    metrics.dead_occurrences.inc(result.dead)
    return result
