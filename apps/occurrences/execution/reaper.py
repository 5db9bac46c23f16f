"""Take back attempts whose worker is gone: step 4 of the execution path (`manage.py reap`).

Lock story of the reaper — it may run in several processes at once, and concurrently with
claims, heartbeats and completions; one set-based statement in one transaction:
- expired attempts are locked FOR UPDATE SKIP LOCKED, so the reaper never waits for a
  completion or a heartbeat in flight (that row is looked at again next pass) and two reapers
  never take the same attempt;
- the occurrence update is conditional on (RUNNING, same attempt_count), like a completion's
  (complete.py, c): whichever of the two commits first wins, the other changes nothing;
- RUNNING past lease + grace → RETRY_WAIT with a retry-lane outbox row due now, or DEAD when
  the attempts or the deadline are exhausted, or the tenant's hourly retry budget is spent:
  a re-queue is a re-run and spends the budget like a retry (retry_bounds.py), and a refusal
  reads like a completion's (`[not retried: …]`, `tick_retries_refused_total{reason}`).
  A QUEUE_ONE occurrence WAITING behind a reaped one runs at its next re-check (claim.py, b).
One transaction, set-based at every step (no statement per attempt): lock and judge the
expired attempts, spend the budgets of all their tenants (retry_bounds.py: lock order
attempt → budget row → occurrence, as in complete.py), then close the attempts and move the
occurrences in one statement.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

from django.conf import settings
from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper

from apps.occurrences.alert_records import DEAD_ALERT_PARAMS, dead_alerts_cte
from apps.occurrences.execution.requeue import REQUEUED_TO_OUTBOX
from apps.occurrences.execution.retry_bounds import (
    Refusal,
    RefusalReason,
    attempts_refusal,
    budget_refusal,
    deadline_refusal,
    spend_retry_budgets,
)
from apps.occurrences.models import Attempt, Lane, Occurrence
from apps.occurrences.observability import metrics

# Lock the expired attempts (SKIP LOCKED: never wait for a completion or a heartbeat) and
# read what judging them needs; `current` = the occurrence is still RUNNING this attempt.
_EXPIRED = """
    WITH locked AS (
        SELECT id, scheduled_for, occurrence_id, attempt_no FROM occurrences_attempt
        WHERE finished_at IS NULL AND lease_expires_at < %(cutoff)s
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    SELECT l.id, l.scheduled_for, l.attempt_no - o.attempt_base,
           COALESCE(o.deadline_at, o.scheduled_for + make_interval(secs => %(deadline_s)s)),
           o.tenant_id, t.retry_budget_per_hour,
           COALESCE(o.state = %(running)s AND o.attempt_count = l.attempt_no, false)
    FROM locked l
    LEFT JOIN occurrences_occurrence o
        ON o.id = l.occurrence_id AND o.scheduled_for = l.scheduled_for
    LEFT JOIN tenants_tenant t ON t.id = o.tenant_id
    ORDER BY l.scheduled_for
"""

# Close the judged attempts and move their occurrences: `refusal` '' = re-queue through
# the outbox, else DEAD with the reason appended to the attempt's error.
_REAP = (
    """
    WITH judged AS (
        SELECT * FROM unnest(%(ids)s::uuid[], %(scheduled_fors)s::timestamptz[],
                             %(refusals)s::text[], %(reasons)s::text[])
            AS j(id, scheduled_for, refusal, reason)
    ),
    expired AS (
        UPDATE occurrences_attempt a
        SET finished_at = %(now)s, outcome = %(lease_expired)s,
            error_class = 'LeaseExpired',
            error_message = 'no heartbeat before the lease expired (worker lost?)'
                || CASE WHEN j.refusal = '' THEN '' ELSE ' [not retried: ' || j.refusal || ']' END
        FROM judged j
        WHERE a.id = j.id AND a.scheduled_for = j.scheduled_for
        RETURNING a.occurrence_id, a.scheduled_for, a.attempt_no, j.refusal, j.reason
    ),
    requeued AS (
        UPDATE occurrences_occurrence o
        SET state = CASE WHEN e.refusal = '' THEN %(retry_wait)s ELSE %(dead)s END,
            finished_at = CASE WHEN e.refusal = '' THEN NULL ELSE %(now)s END
        FROM expired e
        WHERE o.id = e.occurrence_id AND o.scheduled_for = e.scheduled_for
          AND o.state = %(running)s AND o.attempt_count = e.attempt_no
        RETURNING o.id, o.scheduled_for, o.schedule_id, o.schedule_version, o.tenant_id,
                  o.state, e.reason
    ),
    outbox AS ("""
    + REQUEUED_TO_OUTBOX
    + """
        WHERE r.state = %(retry_wait)s
        RETURNING 1
    ),"""
    + dead_alerts_cte("alerted", "(SELECT * FROM requeued WHERE state = %(dead)s)")
    + """
    SELECT (SELECT count(*) FROM expired), (SELECT count(*) FROM outbox),
           (SELECT array_agg(reason) FROM requeued WHERE state = %(dead)s)
"""
)


@dataclass(frozen=True)
class ReapResult:
    expired: int
    requeued: int
    dead: int


class _Expired(NamedTuple):
    id: uuid.UUID
    scheduled_for: datetime
    attempts: int | None  # since the last replay; None: the occurrence is gone
    deadline: datetime | None
    tenant_id: uuid.UUID | None
    retry_budget_per_hour: int | None
    current: bool  # still RUNNING this attempt: re-queued or sent DEAD


def _refusals(
    cursor: CursorWrapper, expired: list[_Expired], now: datetime
) -> list[Refusal | None]:
    """Per attempt (None = re-queue): the attempts and the deadline first, then the budget of
    its tenant, spent by all re-queues of this pass at once; oldest instants first."""
    refusals: list[Refusal | None] = [None] * len(expired)
    candidates: dict[uuid.UUID, list[int]] = defaultdict(list)
    for n, row in enumerate(expired):
        if not row.current:
            continue  # a completion or a newer attempt already moved it
        assert row.attempts is not None and row.deadline is not None
        if row.attempts >= settings.TICK_MAX_ATTEMPTS:
            refusals[n] = attempts_refusal(row.attempts, settings.TICK_MAX_ATTEMPTS)
        elif now > row.deadline:
            refusals[n] = deadline_refusal(row.deadline)
        else:
            assert row.tenant_id is not None
            candidates[row.tenant_id].append(n)
    limits = {t: expired[rows[0]].retry_budget_per_hour or 0 for t, rows in candidates.items()}
    granted = spend_retry_budgets(
        cursor, {t: (len(rows), limits[t]) for t, rows in candidates.items()}, now=now
    )
    for tenant_id, rows in candidates.items():
        for n in rows[granted[tenant_id] :]:
            refusals[n] = budget_refusal(limits[tenant_id])
    return refusals


def attempts_reap(*, now: datetime, grace_s: int, limit: int = 1000) -> ReapResult:
    """Close attempts whose lease expired more than `grace_s` ago and send their occurrences
    back through the outbox (retry lane), set-based and in one transaction.

    This is what saves an occurrence whose worker died after the broker considered the
    message handled (e.g. a pool child killed by the OOM killer is acknowledged by Celery,
    or its redelivery is dropped at claim because the occurrence still looks RUNNING).
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            _EXPIRED,
            {
                "cutoff": now - timedelta(seconds=grace_s),
                "limit": limit,
                "deadline_s": settings.TICK_RETRY_DEADLINE_S,
                "running": Occurrence.State.RUNNING,
            },
        )
        expired = [_Expired(*values) for values in cursor.fetchall()]
        row: tuple[int, int, list[str] | None] | None = (0, 0, None)
        if expired:
            refusals = _refusals(cursor, expired, now)
            cursor.execute(
                _REAP,
                {
                    "ids": [e.id for e in expired],
                    "scheduled_fors": [e.scheduled_for for e in expired],
                    "refusals": [r.text if r else "" for r in refusals],
                    "reasons": [r.reason if r else "" for r in refusals],
                    "now": now,
                    "lease_expired": Attempt.Outcome.LEASE_EXPIRED,
                    "running": Occurrence.State.RUNNING,
                    "retry_wait": Occurrence.State.RETRY_WAIT,
                    "dead": Occurrence.State.DEAD,
                    "retry_lane": Lane.RETRY,
                    **DEAD_ALERT_PARAMS,
                },
            )
            row = cursor.fetchone()
        # Retry budgets of past hours are no longer read.
        cursor.execute(
            "DELETE FROM occurrences_retrybudget WHERE window_start < %s",
            [now - timedelta(hours=2)],
        )
    assert row is not None
    dead_reasons = row[2] or []
    result = ReapResult(int(row[0]), int(row[1]), len(dead_reasons))
    metrics.attempts_finished.labels(outcome=Attempt.Outcome.LEASE_EXPIRED).inc(result.expired)
    metrics.retries_scheduled.inc(result.requeued)
    metrics.dead_occurrences.inc(result.dead)
    for reason in dead_reasons:
        metrics.retries_refused.labels(reason=RefusalReason(reason)).inc()
    return result
