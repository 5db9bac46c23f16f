"""The worker side of an occurrence (docs/decisions.md "Execution"): claim, run the handler,
complete fenced by the lease; the reaper, cooperative cancel and DLQ replay.

Lock story — every line may run concurrently with itself; locks are always taken in this
order (occurrence row → schedule advisory lock → tenant advisory lock), so no cycle exists:
1. `occurrence_claim`, one transaction:
   a. Lock the occurrence row (FOR UPDATE); re-check its state, the schedule's current
      version (else SUPERSEDED) and cancellation (else CANCELED). A second delivery blocks
      on the row lock, then sees RUNNING or a final state and is dropped as a DUPLICATE
      (counted; the task acks, the handler never runs).
   b. Overlap (SKIP_IF_RUNNING, QUEUE_ONE): take `pg_advisory_xact_lock(SCHEDULE, H(schedule))`
      and look for another RUNNING / WAITING occurrence of the schedule. Every claim and every
      QUEUE_ONE completion of that schedule holds the same lock, so "check and transition"
      is atomic: SKIPPED_OVERLAP, WAITING (parked, with a re-check outbox row) or, for an
      occurrence that already had attempts, a delay through the outbox — never two RUNNING.
   c. Quota: take `pg_advisory_xact_lock(TENANT, H(tenant))` and count the tenant's open
      attempts; at `Tenant.max_running` the occurrence is re-queued through the outbox
      (retry lane, short jittered delay), state unchanged: delayed, never failed.
   d. Insert the Attempt (fresh `lease_token`, `lease_expires_at`), occurrence → RUNNING.
2. The handler runs outside any transaction. A heartbeat thread renews the lease every
   lease/3 and sets `ctx.cancel_requested` when the occurrence or its schedule is canceled,
   or when the lease was lost (the work is no longer this worker's).
3. `attempt_complete`, one transaction: lock the attempt row only if it still holds the lease
   (same token, unfinished) — else the result is stale: ignored and counted. Then decide:
   SUCCEEDED; CANCELED; DEAD (permanent error, or a transient one past max attempts, the
   occurrence deadline or the tenant's hourly retry budget — a conditional upsert);
   RETRY_WAIT with a full-jitter retry row in the outbox. The occurrence update is
   conditional on (RUNNING, same attempt_count). A QUEUE_ONE completion then takes the
   schedule lock (1b) and wakes the WAITING occurrence with an outbox row due now.
4. `attempts_reap` (set-based, attempts FOR UPDATE SKIP LOCKED, so it never waits for a
   completion in flight): RUNNING past lease + grace → RETRY_WAIT through the outbox, or DEAD
   when attempts or the deadline are exhausted.
5. `occurrences_replay`: conditional `UPDATE … WHERE state = 'DEAD'` + outbox row in one
   statement: same id, RETRY_WAIT, a fresh attempt budget and deadline.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from apps.occurrences.execution import webhook as _webhook  # noqa: F401 - registers the handler
from apps.occurrences.execution.handlers import (
    Canceled,
    ErrorClass,
    HandlerContext,
    PermanentError,
    classify_error,
    get_handler,
)
from apps.occurrences.models import Attempt, Lane, Occurrence
from apps.occurrences.observability import logs, metrics
from apps.occurrences.pipeline.outages import (
    call_through_outages,
    drop_database_connection,
    outage_of,
)

log = logging.getLogger(__name__)

CLAIMABLE = (
    Occurrence.State.SCHEDULED,
    Occurrence.State.ENQUEUED,
    Occurrence.State.RETRY_WAIT,
    Occurrence.State.WAITING,
)
# Advisory lock namespaces (first key of the two-int form); the second is H(id).
SCHEDULE_LOCK = 6001
TENANT_LOCK = 6002


class ClaimStatus(StrEnum):
    CLAIMED = "claimed"
    DUPLICATE = "duplicate"
    NOT_FOUND = "not_found"
    SUPERSEDED = "superseded"
    CANCELED = "canceled"
    SKIPPED_OVERLAP = "skipped_overlap"
    WAITING = "waiting"  # QUEUE_ONE: parked behind the running one
    DELAYED = "delayed"  # re-queued through the outbox (quota, or a retry behind a run)


@dataclass(frozen=True)
class Claim:
    status: ClaimStatus
    context: HandlerContext | None = None
    attempt_id: uuid.UUID | None = None
    lease_token: uuid.UUID | None = None
    handler: str = ""
    shard: int = 0
    overlap_policy: str = "ALLOW"
    attempt_base: int = 0
    deadline_at: datetime | None = None
    retry_budget_per_hour: int = 0


def lock_key(value: uuid.UUID) -> int:
    """Stable signed 32-bit H(id) for advisory locks (blake2b, like every hash in Tick)."""
    return int.from_bytes(hashlib.blake2b(value.bytes, digest_size=4).digest(), "big", signed=True)


def _advisory_lock(cursor: CursorWrapper, namespace: int, value: uuid.UUID) -> None:
    cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [namespace, lock_key(value)])


@dataclass(frozen=True)
class _Occ:
    """What an outbox row needs to know about an occurrence."""

    occurrence_id: uuid.UUID
    scheduled_for: datetime
    schedule_id: uuid.UUID
    schedule_version: int
    tenant_id: uuid.UUID
    shard: int


def _outbox_insert(
    cursor: CursorWrapper, occ: _Occ, *, available_at: datetime, now: datetime
) -> None:
    cursor.execute(
        """
        INSERT INTO occurrences_dispatchoutbox
            (occurrence_id, scheduled_for, schedule_id, schedule_version, tenant_id, shard,
             lane, available_at, created_at)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
        """,
        [occ.occurrence_id, occ.scheduled_for, occ.schedule_id, occ.schedule_version,
         occ.tenant_id, occ.shard, Lane.RETRY, available_at, now],
    )  # fmt: skip


def _lookback(now: datetime) -> datetime:
    return now - timedelta(seconds=settings.TICK_OVERLAP_LOOKBACK_S)


_rng = random.SystemRandom()


def occurrence_claim(
    *,
    occurrence_id: uuid.UUID,
    scheduled_for: datetime,
    worker_id: str,
    now: datetime | None = None,
) -> Claim:
    """Claim an occurrence for one attempt (module docstring, step 1)."""
    now = now or timezone.now()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT o.state, o.schedule_version, o.attempt_count, o.tenant_id,
                   o.attempt_base, o.deadline_at, o.cancel_requested_at IS NOT NULL,
                   s.id, s.version, s.state, s.handler, s.payload::text, s.shard,
                   s.overlap_policy, t.max_running, t.retry_budget_per_hour, o.enqueued_at
            FROM occurrences_occurrence o
            JOIN schedules_schedule s ON s.id = o.schedule_id
            JOIN tenants_tenant t ON t.id = o.tenant_id
            WHERE o.id = %s AND o.scheduled_for = %s
            FOR UPDATE OF o
            """,
            [occurrence_id, scheduled_for],
        )
        row = cursor.fetchone()
        if row is None:
            return Claim(ClaimStatus.NOT_FOUND)
        (state, occ_version, attempt_count, tenant_id, attempt_base, deadline_at,
         cancel_requested, schedule_id, version, schedule_state, handler, payload, shard,
         overlap_policy, max_running, retry_budget, enqueued_at) = row  # fmt: skip
        occ = _Occ(occurrence_id, scheduled_for, schedule_id, occ_version, tenant_id, shard)
        # 1a. state, cancellation, version
        if state not in CLAIMABLE:
            metrics.duplicate_claims.inc()
            return Claim(ClaimStatus.DUPLICATE)
        if schedule_state == "CANCELED" or cancel_requested or occ_version != version:
            canceled = schedule_state == "CANCELED" or cancel_requested
            final = Occurrence.State.CANCELED if canceled else Occurrence.State.SUPERSEDED
            _finish(cursor, occurrence_id, scheduled_for, final, now)
            return Claim(ClaimStatus.CANCELED if canceled else ClaimStatus.SUPERSEDED)
        # 1b. overlap policy, atomically under the schedule lock
        if overlap_policy != "ALLOW":
            verdict = _overlap_verdict(
                cursor,
                occ,
                policy=overlap_policy,
                state=state,
                attempt_count=attempt_count,
                now=now,
            )
            if verdict is not None:
                return Claim(verdict)
        # 1c. tenant run-concurrency quota, atomically under the tenant lock
        _advisory_lock(cursor, TENANT_LOCK, tenant_id)
        cursor.execute(
            "SELECT count(*) FROM occurrences_attempt WHERE tenant_id = %s AND finished_at IS NULL",
            [tenant_id],
        )
        running = cursor.fetchone()
        if running is not None and running[0] >= max_running:
            delay = settings.TICK_QUOTA_DELAY_S * (1 + _rng.random())
            _outbox_insert(cursor, occ, available_at=now + timedelta(seconds=delay), now=now)
            metrics.quota_delays.inc()
            return Claim(ClaimStatus.DELAYED)
        # 1d. the attempt
        if state == Occurrence.State.ENQUEUED and enqueued_at is not None:
            wait = (now - enqueued_at).total_seconds()
            metrics.occurrence_state_seconds.labels(state="ENQUEUED").observe(max(wait, 0.0))
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
            [attempt_id, scheduled_for, occurrence_id, tenant_id, attempt_no, lease_token,
             now + timedelta(seconds=settings.TICK_ATTEMPT_LEASE_S), worker_id[:200], now],
        )  # fmt: skip
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
    return Claim(
        ClaimStatus.CLAIMED,
        context,
        attempt_id,
        lease_token,
        handler,
        shard,
        overlap_policy=overlap_policy,
        attempt_base=attempt_base,
        deadline_at=deadline_at,
        retry_budget_per_hour=retry_budget,
    )


def _finish(
    cursor: CursorWrapper,
    occurrence_id: uuid.UUID,
    scheduled_for: datetime,
    state: Occurrence.State,
    now: datetime,
) -> None:
    cursor.execute(
        "UPDATE occurrences_occurrence SET state = %s, finished_at = %s "
        "WHERE id = %s AND scheduled_for = %s",
        [state, now, occurrence_id, scheduled_for],
    )


def _overlap_verdict(
    cursor: CursorWrapper, occ: _Occ, *, policy: str, state: str, attempt_count: int, now: datetime
) -> ClaimStatus | None:
    """Step 1b; None = go on and run. Caller holds the occurrence row lock."""
    _advisory_lock(cursor, SCHEDULE_LOCK, occ.schedule_id)
    cursor.execute(
        """
        SELECT count(*) FILTER (WHERE state = 'RUNNING'),
               count(*) FILTER (WHERE state = 'WAITING')
        FROM occurrences_occurrence
        WHERE schedule_id = %s AND scheduled_for >= %s AND state IN ('RUNNING', 'WAITING')
          AND NOT (id = %s AND scheduled_for = %s)
        """,
        [occ.schedule_id, _lookback(now), occ.occurrence_id, occ.scheduled_for],
    )
    counts = cursor.fetchone()
    running, waiting = (int(counts[0]), int(counts[1])) if counts else (0, 0)
    # A fresh run can be skipped; one that already started (a retry, a replay) or the
    # parked QUEUE_ONE one must never be dropped, only delayed.
    fresh = attempt_count == 0 and state != Occurrence.State.WAITING
    recheck_at = now + timedelta(seconds=settings.TICK_OVERLAP_RECHECK_S)
    if policy == "QUEUE_ONE":
        if state == Occurrence.State.WAITING and running:
            _outbox_insert(cursor, occ, available_at=recheck_at, now=now)
            metrics.overlap_waits.inc()
            return ClaimStatus.WAITING
        if state == Occurrence.State.WAITING or not (running or waiting):
            return None
        if running and not waiting and fresh:
            cursor.execute(
                "UPDATE occurrences_occurrence SET state = 'WAITING' "
                "WHERE id = %s AND scheduled_for = %s",
                [occ.occurrence_id, occ.scheduled_for],
            )
            _outbox_insert(cursor, occ, available_at=recheck_at, now=now)
            metrics.overlap_waits.inc()
            return ClaimStatus.WAITING
    elif not running:
        return None
    if fresh:
        _finish(cursor, occ.occurrence_id, occ.scheduled_for, Occurrence.State.SKIPPED_OVERLAP, now)
        metrics.overlap_skips.labels(policy=policy).inc()
        return ClaimStatus.SKIPPED_OVERLAP
    _outbox_insert(cursor, occ, available_at=recheck_at, now=now)
    metrics.overlap_waits.inc()
    return ClaimStatus.DELAYED


def retry_delay(attempt_no: int, *, base_s: float, cap_s: float, rng: random.Random) -> float:
    """Exponential backoff with full jitter: uniform(0, min(cap, base * 2^(n-1)))."""
    return rng.uniform(0, min(cap_s, base_s * 2 ** (attempt_no - 1)))


def retry_deadline(*, scheduled_for: datetime, deadline_at: datetime | None) -> datetime:
    return deadline_at or scheduled_for + timedelta(seconds=settings.TICK_RETRY_DEADLINE_S)


def _spend_retry_budget(
    cursor: CursorWrapper, *, tenant_id: uuid.UUID, limit: int, now: datetime
) -> bool:
    """Take one retry from the tenant's budget of the current UTC hour; False when spent.
    The conditional upsert is atomic: concurrent completions never overspend."""
    if limit <= 0:
        return False
    window = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    cursor.execute(
        """
        INSERT INTO occurrences_retrybudget (tenant_id, window_start, used) VALUES (%s, %s, 1)
        ON CONFLICT (tenant_id, window_start)
        DO UPDATE SET used = occurrences_retrybudget.used + 1
        WHERE occurrences_retrybudget.used < %s
        RETURNING used
        """,
        [tenant_id, window, limit],
    )
    return cursor.fetchone() is not None


def attempt_complete(
    *,
    claim: Claim,
    error: BaseException | None = None,
    now: datetime | None = None,
    rng: random.Random | None = None,
) -> Occurrence.State | None:
    """Record an attempt's result if it still holds its lease (module docstring, step 3);
    returns the new state, or None when the completion was stale and ignored."""
    assert claim.context is not None and claim.attempt_id is not None
    ctx = claim.context
    now = now or timezone.now()
    error_class = type(error).__qualname__ if error is not None else ""
    error_message = str(error)[:4000] if error is not None else ""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT 1 FROM occurrences_attempt
            WHERE id = %s AND scheduled_for = %s AND lease_token = %s AND finished_at IS NULL
            FOR UPDATE
            """,
            [claim.attempt_id, ctx.scheduled_for, claim.lease_token],
        )
        if cursor.fetchone() is None:
            metrics.stale_completions.inc()
            return None
        retry_at: datetime | None = None
        if error is None:
            outcome, state = Attempt.Outcome.SUCCEEDED, Occurrence.State.SUCCEEDED
        elif isinstance(error, Canceled) or ctx.cancel_requested.is_set():
            outcome, state = Attempt.Outcome.CANCELED, Occurrence.State.CANCELED
        elif classify_error(error) == ErrorClass.PERMANENT:
            outcome, state = Attempt.Outcome.FAILED, Occurrence.State.DEAD
        else:
            refused, retry_at = _retry_decision(cursor, claim=claim, now=now, rng=rng or _rng)
            if refused:
                outcome, state = Attempt.Outcome.FAILED, Occurrence.State.DEAD
                error_message = f"{error_message[:3900]} [not retried: {refused}]"
                metrics.retries_refused.labels(reason=refused.split(" ")[0]).inc()
            else:
                outcome, state = Attempt.Outcome.RETRY, Occurrence.State.RETRY_WAIT
        cursor.execute(
            """
            UPDATE occurrences_occurrence SET state = %s, finished_at = %s
            WHERE id = %s AND scheduled_for = %s AND state = 'RUNNING' AND attempt_count = %s
            """,
            [state, None if state == Occurrence.State.RETRY_WAIT else now, ctx.occurrence_id,
             ctx.scheduled_for, ctx.attempt_no],
        )  # fmt: skip
        if cursor.rowcount != 1:
            metrics.stale_completions.inc()
            transaction.set_rollback(True)
            return None
        cursor.execute(
            """
            UPDATE occurrences_attempt
            SET finished_at = %s, outcome = %s, error_class = %s, error_message = %s
            WHERE id = %s AND scheduled_for = %s AND lease_token = %s AND finished_at IS NULL
            """,
            [now, outcome, error_class, error_message, claim.attempt_id, ctx.scheduled_for,
             claim.lease_token],
        )  # fmt: skip
        if retry_at is not None and state == Occurrence.State.RETRY_WAIT:
            occ = _Occ(ctx.occurrence_id, ctx.scheduled_for, ctx.schedule_id,
                       ctx.schedule_version, ctx.tenant_id, claim.shard)  # fmt: skip
            _outbox_insert(cursor, occ, available_at=retry_at, now=now)
            metrics.retries_scheduled.inc()
        elif state == Occurrence.State.DEAD:
            metrics.dead_occurrences.inc()
        elif state == Occurrence.State.CANCELED:
            metrics.cancels.inc()
        if claim.overlap_policy == "QUEUE_ONE":
            _wake_waiting(cursor, claim=claim, now=now)
    metrics.attempts_finished.labels(outcome=outcome).inc()
    return state


def _retry_decision(
    cursor: CursorWrapper, *, claim: Claim, now: datetime, rng: random.Random
) -> tuple[str, datetime | None]:
    """('', retry instant) for a retry, or (reason, None) when a bound refuses it."""
    assert claim.context is not None
    ctx = claim.context
    attempts = ctx.attempt_no - claim.attempt_base
    if attempts >= settings.TICK_MAX_ATTEMPTS:
        return f"attempts exhausted ({attempts} of {settings.TICK_MAX_ATTEMPTS})", None
    delay = retry_delay(
        attempts, base_s=settings.TICK_RETRY_BASE_S, cap_s=settings.TICK_RETRY_CAP_S, rng=rng
    )
    retry_at = now + timedelta(seconds=delay)
    deadline = retry_deadline(scheduled_for=ctx.scheduled_for, deadline_at=claim.deadline_at)
    if retry_at > deadline:
        return f"deadline {deadline.isoformat()} passed", None
    if not _spend_retry_budget(
        cursor, tenant_id=ctx.tenant_id, limit=claim.retry_budget_per_hour, now=now
    ):
        return f"budget of {claim.retry_budget_per_hour} retries/hour spent", None
    return "", retry_at


def _wake_waiting(cursor: CursorWrapper, *, claim: Claim, now: datetime) -> None:
    """QUEUE_ONE: the running one left RUNNING; let the WAITING one run now (step 3)."""
    assert claim.context is not None
    ctx = claim.context
    _advisory_lock(cursor, SCHEDULE_LOCK, ctx.schedule_id)
    cursor.execute(
        """
        SELECT id, scheduled_for, schedule_version FROM occurrences_occurrence
        WHERE schedule_id = %s AND scheduled_for >= %s AND state = 'WAITING'
        ORDER BY scheduled_for LIMIT 1
        """,
        [ctx.schedule_id, _lookback(now)],
    )
    row = cursor.fetchone()
    if row is not None:
        waiting = _Occ(row[0], row[1], ctx.schedule_id, row[2], ctx.tenant_id, claim.shard)
        _outbox_insert(cursor, waiting, available_at=now, now=now)


@dataclass(frozen=True)
class Beat:
    lease_held: bool
    cancel_requested: bool


def attempt_heartbeat(*, claim: Claim) -> Beat:
    """Extend the attempt's lease and report whether cancellation was requested."""
    assert claim.context is not None
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE occurrences_attempt a
            SET lease_expires_at = now() + make_interval(secs => %s)
            WHERE a.id = %s AND a.scheduled_for = %s AND a.lease_token = %s
              AND a.finished_at IS NULL
            RETURNING (
                SELECT o.cancel_requested_at IS NOT NULL OR s.state = 'CANCELED'
                FROM occurrences_occurrence o JOIN schedules_schedule s ON s.id = o.schedule_id
                WHERE o.id = a.occurrence_id AND o.scheduled_for = a.scheduled_for
            )
            """,
            [settings.TICK_ATTEMPT_LEASE_S, claim.attempt_id, claim.context.scheduled_for,
             claim.lease_token],
        )  # fmt: skip
        row = cursor.fetchone()
    if row is None:
        return Beat(lease_held=False, cancel_requested=False)
    return Beat(lease_held=True, cancel_requested=bool(row[0]))


class _Heartbeat(threading.Thread):
    """Renews a running attempt's lease every lease/3 until stopped (step 2)."""

    def __init__(self, claim: Claim) -> None:
        super().__init__(name="tick-heartbeat", daemon=True)
        self.claim = claim
        self.stopped = threading.Event()

    def run(self) -> None:
        assert self.claim.context is not None
        cancel = self.claim.context.cancel_requested
        interval = settings.TICK_ATTEMPT_LEASE_S / 3
        try:
            while not self.stopped.wait(interval):
                try:
                    beat = attempt_heartbeat(claim=self.claim)
                except Exception as exc:
                    if outage_of(exc) is None:
                        raise
                    # The handler goes on; the next beat renews the lease if the database
                    # is back before it expires, else the lease is found lost (below).
                    log.warning("heartbeat of %s failed: %r", self.claim.attempt_id, exc)
                    drop_database_connection()
                    continue
                if not beat.lease_held:
                    log.warning("lease of %s lost while running", self.claim.attempt_id)
                    cancel.set()
                    return
                if beat.cancel_requested and not cancel.is_set():
                    log.info("cancel requested for %s", self.claim.context.occurrence_id)
                    cancel.set()
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
        SET state = CASE
                WHEN e.attempt_no - o.attempt_base >= %(max_attempts)s
                  OR %(now)s > COALESCE(o.deadline_at,
                                        o.scheduled_for + make_interval(secs => %(deadline_s)s))
                THEN 'DEAD' ELSE 'RETRY_WAIT' END,
            finished_at = CASE
                WHEN e.attempt_no - o.attempt_base >= %(max_attempts)s
                  OR %(now)s > COALESCE(o.deadline_at,
                                        o.scheduled_for + make_interval(secs => %(deadline_s)s))
                THEN %(now)s END
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
    back through the outbox (retry lane), set-based and in one transaction (step 4).

    This is what saves an occurrence whose worker died after the broker considered the
    message handled (e.g. a pool child killed by the OOM killer is acknowledged by Celery,
    or its redelivery is dropped at claim because the occurrence still looks RUNNING).
    A QUEUE_ONE occurrence WAITING behind a reaped one runs at its next re-check.
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


@dataclass
class ReplayResult:
    replayed: list[uuid.UUID] = field(default_factory=list)
    not_dead: dict[uuid.UUID, str] = field(default_factory=dict)  # id -> current state
    not_found: list[uuid.UUID] = field(default_factory=list)


_REPLAY = """
    WITH replayed AS (
        UPDATE occurrences_occurrence o
        SET state = 'RETRY_WAIT', finished_at = NULL, attempt_base = o.attempt_count,
            deadline_at = %(deadline)s, cancel_requested_at = NULL
        WHERE o.tenant_id = %(tenant)s AND o.id = ANY(%(ids)s) AND o.state = 'DEAD'
        RETURNING o.id, o.scheduled_for, o.schedule_id, o.schedule_version, o.tenant_id
    ),
    outbox AS (
        INSERT INTO occurrences_dispatchoutbox
            (occurrence_id, scheduled_for, schedule_id, schedule_version, tenant_id, shard,
             lane, available_at, created_at)
        SELECT r.id, r.scheduled_for, r.schedule_id, r.schedule_version, r.tenant_id, s.shard,
               'retry', %(now)s, %(now)s
        FROM replayed r JOIN schedules_schedule s ON s.id = r.schedule_id
        RETURNING 1
    )
    SELECT id FROM replayed
"""


def occurrences_replay(
    *, tenant_id: uuid.UUID, occurrence_ids: Sequence[uuid.UUID], now: datetime | None = None
) -> ReplayResult:
    """Replay DEAD occurrences of one tenant (step 5): same id, back to RETRY_WAIT with a
    retry-lane outbox row due now, a fresh attempt budget and deadline. Ids of other
    tenants are reported not found and left untouched."""
    now = now or timezone.now()
    ids = list(dict.fromkeys(occurrence_ids))
    result = ReplayResult()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            _REPLAY,
            {
                "tenant": tenant_id,
                "ids": ids,
                "now": now,
                "deadline": now + timedelta(seconds=settings.TICK_RETRY_DEADLINE_S),
            },
        )
        replayed = {r[0] for r in cursor.fetchall()}
        rest = [i for i in ids if i not in replayed]
        if rest:
            cursor.execute(
                "SELECT id, state FROM occurrences_occurrence "
                "WHERE tenant_id = %s AND id = ANY(%s)",
                [tenant_id, rest],
            )
            result.not_dead = {r[0]: r[1] for r in cursor.fetchall()}
    result.replayed = [i for i in ids if i in replayed]
    result.not_found = [i for i in rest if i not in result.not_dead]
    metrics.replays.inc(len(result.replayed))
    return result


class CancelOutcome(StrEnum):
    CANCELED = "canceled"  # was not running: final at once
    REQUESTED = "cancel_requested"  # running: the handler is asked to stop
    FINAL = "final"  # already finished: nothing to cancel
    NOT_FOUND = "not_found"


def occurrence_cancel(
    *, tenant_id: uuid.UUID, occurrence_id: uuid.UUID, now: datetime | None = None
) -> CancelOutcome:
    """Cancel one occurrence: pending → CANCELED now; RUNNING → cooperative (the heartbeat
    raises the handler's flag; the attempt ends CANCELED). Conditional updates only."""
    now = now or timezone.now()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE occurrences_occurrence SET state = 'CANCELED', finished_at = %s
            WHERE tenant_id = %s AND id = %s AND state = ANY(%s)
            """,
            [now, tenant_id, occurrence_id, list(CLAIMABLE)],
        )
        if cursor.rowcount:
            return CancelOutcome.CANCELED
        cursor.execute(
            """
            UPDATE occurrences_occurrence
            SET cancel_requested_at = COALESCE(cancel_requested_at, %s)
            WHERE tenant_id = %s AND id = %s AND state = 'RUNNING'
            """,
            [now, tenant_id, occurrence_id],
        )
        if cursor.rowcount:
            return CancelOutcome.REQUESTED
        cursor.execute(
            "SELECT 1 FROM occurrences_occurrence WHERE tenant_id = %s AND id = %s",
            [tenant_id, occurrence_id],
        )
        return CancelOutcome.FINAL if cursor.fetchone() else CancelOutcome.NOT_FOUND


def occurrence_execute(
    *, occurrence_id: uuid.UUID, scheduled_for: datetime, worker_id: str
) -> dict[str, Any]:
    """Claim, run the registered handler, complete. Returns a summary for logs and tests.

    Database outages (docs/decisions.md, "Worker acknowledgements"):
    - before the claim commits nothing is durable, so the claim is retried with backoff for
      up to `TICK_WORKER_OUTAGE_RETRY_S`; past that the outage error propagates and the task
      hands its message back to the broker (never acknowledged undone);
    - once the claim committed, the open attempt and its lease are the durable record: a
      completion that cannot be written is retried the same way, and if it still fails the
      reaper re-queues the occurrence when the lease expires (a same-id re-run).
    """
    claim = call_through_outages(
        lambda: occurrence_claim(
            occurrence_id=occurrence_id, scheduled_for=scheduled_for, worker_id=worker_id
        ),
        who=f"claim {occurrence_id}",
        role="worker",
        give_up_after_s=settings.TICK_WORKER_OUTAGE_RETRY_S,
    )
    if claim.status != ClaimStatus.CLAIMED or claim.context is None:
        log.info("occurrence %s not run: %s", occurrence_id, claim.status.value,
                 extra=logs.ids(occurrence_id=occurrence_id))  # fmt: skip
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
                        claim.context.attempt_no, exc,
                        extra=logs.ids(tenant_id=claim.context.tenant_id,
                                       schedule_id=claim.context.schedule_id,
                                       occurrence_id=occurrence_id))  # fmt: skip
        finally:
            heartbeat.stopped.set()
            heartbeat.join()
    try:
        state = call_through_outages(
            lambda: attempt_complete(claim=claim, error=error),
            who=f"completion of {occurrence_id}",
            role="worker",
            give_up_after_s=settings.TICK_WORKER_OUTAGE_RETRY_S,
        )
    except Exception as exc:
        if outage_of(exc) is None:
            raise
        log.error("occurrence %s attempt %s: completion not recorded (%r); the reaper "
                  "re-queues it when its lease expires", occurrence_id,
                  claim.context.attempt_no, exc)  # fmt: skip
        return {"status": "unrecorded", "attempt_no": claim.context.attempt_no}
    status = "stale" if state is None else str(state)
    log.info("occurrence %s attempt %s: %s", occurrence_id, claim.context.attempt_no, status,
             extra=logs.ids(tenant_id=claim.context.tenant_id,
                            schedule_id=claim.context.schedule_id,
                            occurrence_id=occurrence_id))  # fmt: skip
    return {"status": status, "attempt_no": claim.context.attempt_no}
