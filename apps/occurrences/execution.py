"""The worker side of an occurrence: claim, run the handler, complete fenced by the lease.

Concurrency story (every line may run concurrently with itself):
1. `occurrence_claim` locks the occurrence row (FOR UPDATE), re-checks its state, the
   schedule's current version and cancellation, then inserts an Attempt with a fresh
   `lease_token` and moves the occurrence to RUNNING, all in one transaction. A second
   delivery of the same occurrence blocks on the row lock, then sees RUNNING (or a final
   state) and is dropped as a duplicate.
2. The handler runs outside any transaction.
3. `attempt_complete` applies only if the attempt still holds its lease (same token, not
   finished): a reaped or superseded attempt's late result is ignored and counted.
   A retry is a new outbox row in the `retry` lane, written in the completion transaction.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.occurrences import metrics
from apps.occurrences.handlers import HandlerContext, PermanentError, get_handler
from apps.occurrences.models import Attempt, Lane, Occurrence

log = logging.getLogger(__name__)

CLAIMABLE = (
    Occurrence.State.SCHEDULED,
    Occurrence.State.ENQUEUED,
    Occurrence.State.RETRY_WAIT,
)


class ClaimStatus(StrEnum):
    CLAIMED = "claimed"
    DUPLICATE = "duplicate"
    NOT_FOUND = "not_found"
    SUPERSEDED = "superseded"
    CANCELED = "canceled"


@dataclass(frozen=True)
class Claim:
    status: ClaimStatus
    context: HandlerContext | None = None
    attempt_id: uuid.UUID | None = None
    lease_token: uuid.UUID | None = None
    handler: str = ""
    shard: int = 0


def occurrence_claim(*, occurrence_id: uuid.UUID, scheduled_for: datetime, worker_id: str) -> Claim:
    """Claim an occurrence for one attempt (see module docstring, step 1)."""
    now = timezone.now()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT o.state, o.schedule_version, o.attempt_count, o.tenant_id,
                   s.id, s.version, s.state, s.handler, s.payload::text, s.shard
            FROM occurrences_occurrence o
            JOIN schedules_schedule s ON s.id = o.schedule_id
            WHERE o.id = %s AND o.scheduled_for = %s
            FOR UPDATE OF o
            """,
            [occurrence_id, scheduled_for],
        )
        row = cursor.fetchone()
        if row is None:
            return Claim(ClaimStatus.NOT_FOUND)
        (state, occ_version, attempt_count, tenant_id, schedule_id, version, schedule_state,
         handler, payload, shard) = row  # fmt: skip
        if state not in CLAIMABLE:
            metrics.duplicate_claims.inc()
            return Claim(ClaimStatus.DUPLICATE)
        if schedule_state == "CANCELED" or occ_version != version:
            final = (
                Occurrence.State.CANCELED
                if schedule_state == "CANCELED"
                else Occurrence.State.SUPERSEDED
            )
            cursor.execute(
                "UPDATE occurrences_occurrence SET state = %s, finished_at = %s "
                "WHERE id = %s AND scheduled_for = %s",
                [final, now, occurrence_id, scheduled_for],
            )
            status = (
                ClaimStatus.CANCELED
                if final == Occurrence.State.CANCELED
                else ClaimStatus.SUPERSEDED
            )
            return Claim(status)
        attempt_no = attempt_count + 1
        attempt_id, lease_token = uuid.uuid4(), uuid.uuid4()
        cursor.execute(
            """
            INSERT INTO occurrences_attempt
                (id, scheduled_for, occurrence_id, tenant_id, attempt_no, lease_token,
                 lease_expires_at, worker_id, started_at, finished_at, outcome,
                 error_class, error_message)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, NULL, '', '', '')
            """,
            [
                attempt_id,
                scheduled_for,
                occurrence_id,
                tenant_id,
                attempt_no,
                lease_token,
                now + timedelta(seconds=settings.TICK_ATTEMPT_LEASE_S),
                worker_id[:200],
                now,
            ],
        )
        cursor.execute(
            "UPDATE occurrences_occurrence SET state = 'RUNNING', attempt_count = %s "
            "WHERE id = %s AND scheduled_for = %s",
            [attempt_no, occurrence_id, scheduled_for],
        )
    context = HandlerContext(
        occurrence_id=occurrence_id,
        schedule_id=schedule_id,
        schedule_version=occ_version,
        tenant_id=tenant_id,
        scheduled_for=scheduled_for,
        attempt_no=attempt_no,
        payload=json.loads(payload),
    )
    return Claim(ClaimStatus.CLAIMED, context, attempt_id, lease_token, handler, shard)


def retry_delay(attempt_no: int, *, base_s: float, cap_s: float, rng: random.Random) -> float:
    """Exponential backoff with full jitter: uniform(0, min(cap, base * 2^(n-1)))."""
    return rng.uniform(0, min(cap_s, base_s * 2 ** (attempt_no - 1)))


_rng = random.SystemRandom()


def attempt_complete(
    *, claim: Claim, error: BaseException | None = None, now: datetime | None = None
) -> Occurrence.State | None:
    """Record an attempt's result if it still holds its lease; returns the new state, or
    None when the completion was stale (lease reaped or token replaced) and ignored."""
    assert claim.context is not None and claim.attempt_id is not None
    ctx = claim.context
    now = now or timezone.now()
    if error is None:
        outcome, state = Attempt.Outcome.SUCCEEDED, Occurrence.State.SUCCEEDED
    elif isinstance(error, PermanentError) or ctx.attempt_no >= settings.TICK_MAX_ATTEMPTS:
        outcome, state = Attempt.Outcome.FAILED, Occurrence.State.DEAD
    else:
        outcome, state = Attempt.Outcome.RETRY, Occurrence.State.RETRY_WAIT
    error_class = type(error).__qualname__ if error is not None else ""
    error_message = str(error)[:4000] if error is not None else ""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE occurrences_attempt
            SET finished_at = %s, outcome = %s, error_class = %s, error_message = %s
            WHERE id = %s AND scheduled_for = %s AND lease_token = %s AND finished_at IS NULL
            """,
            [now, outcome, error_class, error_message, claim.attempt_id, ctx.scheduled_for,
             claim.lease_token],
        )  # fmt: skip
        if cursor.rowcount != 1:
            metrics.stale_completions.inc()
            return None
        cursor.execute(
            """
            UPDATE occurrences_occurrence SET state = %s, finished_at = %s
            WHERE id = %s AND scheduled_for = %s AND state = 'RUNNING' AND attempt_count = %s
            """,
            [
                state,
                None if state == Occurrence.State.RETRY_WAIT else now,
                ctx.occurrence_id,
                ctx.scheduled_for,
                ctx.attempt_no,
            ],
        )
        if cursor.rowcount != 1:
            metrics.stale_completions.inc()
            transaction.set_rollback(True)
            return None
        if state == Occurrence.State.RETRY_WAIT:
            delay = retry_delay(
                ctx.attempt_no,
                base_s=settings.TICK_RETRY_BASE_S,
                cap_s=settings.TICK_RETRY_CAP_S,
                rng=_rng,
            )
            cursor.execute(
                """
                INSERT INTO occurrences_dispatchoutbox
                    (occurrence_id, scheduled_for, schedule_id, schedule_version, tenant_id,
                     shard, lane, available_at, created_at)
                VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
                """,
                [ctx.occurrence_id, ctx.scheduled_for, ctx.schedule_id, ctx.schedule_version,
                 ctx.tenant_id, claim.shard, Lane.RETRY, now + timedelta(seconds=delay), now],
            )  # fmt: skip
            metrics.retries_scheduled.inc()
        elif state == Occurrence.State.DEAD:
            metrics.dead_occurrences.inc()
    metrics.attempts_finished.labels(outcome=outcome).inc()
    return state


def attempt_heartbeat(*, claim: Claim) -> bool:
    """Extend the attempt's lease; False once the lease is lost (reaped or finished)."""
    assert claim.context is not None
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE occurrences_attempt
            SET lease_expires_at = now() + make_interval(secs => %s)
            WHERE id = %s AND scheduled_for = %s AND lease_token = %s AND finished_at IS NULL
            """,
            [settings.TICK_ATTEMPT_LEASE_S, claim.attempt_id, claim.context.scheduled_for,
             claim.lease_token],
        )  # fmt: skip
        return bool(cursor.rowcount == 1)


class _Heartbeat(threading.Thread):
    """Renews a running attempt's lease every lease/3 until stopped."""

    def __init__(self, claim: Claim) -> None:
        super().__init__(name="tick-heartbeat", daemon=True)
        self.claim = claim
        self.stopped = threading.Event()

    def run(self) -> None:
        interval = settings.TICK_ATTEMPT_LEASE_S / 3
        try:
            while not self.stopped.wait(interval):
                if not attempt_heartbeat(claim=self.claim):
                    log.warning("lease of %s lost while running", self.claim.attempt_id)
                    return
        finally:
            connection.close()  # this thread's own connection


_REAP = """
    WITH expired AS (
        UPDATE occurrences_attempt a
        SET finished_at = %(now)s, outcome = 'LEASE_EXPIRED',
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
        SET state = CASE WHEN e.attempt_no >= %(max_attempts)s THEN 'DEAD' ELSE 'RETRY_WAIT' END,
            finished_at = CASE WHEN e.attempt_no >= %(max_attempts)s THEN %(now)s END
        FROM expired e
        WHERE o.id = e.occurrence_id AND o.scheduled_for = e.scheduled_for
          AND o.state = 'RUNNING' AND o.attempt_count = e.attempt_no
        RETURNING o.id, o.scheduled_for, o.schedule_id, o.schedule_version, o.tenant_id, o.state
    ),
    outbox AS (
        INSERT INTO occurrences_dispatchoutbox
            (occurrence_id, scheduled_for, schedule_id, schedule_version, tenant_id, shard,
             lane, available_at, created_at)
        SELECT r.id, r.scheduled_for, r.schedule_id, r.schedule_version, r.tenant_id, s.shard,
               'retry', %(now)s, %(now)s
        FROM requeued r JOIN schedules_schedule s ON s.id = r.schedule_id
        WHERE r.state = 'RETRY_WAIT'
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM expired), (SELECT count(*) FROM outbox),
           (SELECT count(*) FROM requeued WHERE state = 'DEAD')
"""


@dataclass(frozen=True)
class ReapResult:
    expired: int
    requeued: int
    dead: int


def attempts_reap(*, now: datetime, grace_s: int, limit: int = 1000) -> ReapResult:
    """Close attempts whose lease expired more than `grace_s` ago and send their occurrences
    back through the outbox (retry lane), set-based and in one transaction.

    This is what saves an occurrence whose worker died after the broker considered the
    message handled (e.g. a pool child killed by the OOM killer is acknowledged by Celery).
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            _REAP,
            {
                "now": now,
                "cutoff": now - timedelta(seconds=grace_s),
                "limit": limit,
                "max_attempts": settings.TICK_MAX_ATTEMPTS,
            },
        )
        row = cursor.fetchone()
    assert row is not None
    result = ReapResult(int(row[0]), int(row[1]), int(row[2]))
    metrics.attempts_finished.labels(outcome=Attempt.Outcome.LEASE_EXPIRED).inc(result.expired)
    metrics.retries_scheduled.inc(result.requeued)
    metrics.dead_occurrences.inc(result.dead)
    return result


def occurrence_execute(
    *, occurrence_id: uuid.UUID, scheduled_for: datetime, worker_id: str
) -> dict[str, Any]:
    """Claim, run the registered handler, complete. Returns a summary for logs and tests."""
    claim = occurrence_claim(
        occurrence_id=occurrence_id, scheduled_for=scheduled_for, worker_id=worker_id
    )
    if claim.status != ClaimStatus.CLAIMED or claim.context is None:
        log.info("occurrence %s not run: %s", occurrence_id, claim.status.value)
        return {"status": claim.status.value}
    handler = get_handler(claim.handler)
    error: BaseException | None = None
    if handler is None:
        error = PermanentError(f"no handler registered as {claim.handler!r}")
    else:
        heartbeat = _Heartbeat(claim)
        heartbeat.start()
        try:
            handler(claim.context)
        except Exception as exc:  # noqa: BLE001 - every handler failure is classified below
            error = exc
            log.warning("occurrence %s attempt %s failed: %r", occurrence_id,
                        claim.context.attempt_no, exc)  # fmt: skip
        finally:
            heartbeat.stopped.set()
            heartbeat.join()
    state = attempt_complete(claim=claim, error=error)
    status = "stale" if state is None else str(state)
    return {"status": status, "attempt_no": claim.context.attempt_no}
