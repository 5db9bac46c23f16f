"""Claim an occurrence for one attempt: step 1 of the execution path (run.py drives it).

Lock story of the claim — it may run concurrently with itself, with completions and with the
reaper; one transaction, locks in the order of locks.py (row → schedule → tenant):
a. Lock the occurrence row (FOR UPDATE); re-check its state and cancellation (else
   CANCELED). A first attempt found past its max lateness is judged by the misfire policy
   (misfire.py): MISSED, or it runs in the catch-up lane. An occurrence of an older version
   that is still claimable runs: an update recalled (SUPERSEDED) every one it could, and the
   new version starts after those it could not (in flight) or produced for the old one up to
   its boundary (schedule_changes.py), so dropping them here would lose their instants.
   A second delivery blocks on the row lock, then sees RUNNING or a final state and is
   dropped as a DUPLICATE (counted; the task acks, the handler never runs). So is a copy
   that finds the occurrence RETRY_WAIT after a TIMED_OUT attempt, its retry not yet due:
   the message of the attempt reclaimed at its deadline, handed back by the broker when its
   pool process was replaced (deadlines.py).
b. Overlap (SKIP_IF_RUNNING, QUEUE_ONE): take the SCHEDULE advisory lock and look for another
   RUNNING / WAITING occurrence of the schedule. Every claim and every QUEUE_ONE completion of
   that schedule (complete.py) holds the same lock, so "check and transition" is atomic:
   SKIPPED_OVERLAP, WAITING (parked, with a re-check outbox row) or, for an occurrence that
   already had attempts, a delay through the outbox — never two RUNNING.
c. Quota: take the TENANT advisory lock and count the worker slots the tenant's open
   attempts hold (distinct worker ids: one pool process runs one handler at a time, and
   an envelope run's attempts share one; docs/decisions.md "A tenant's running work counted
   in worker slots"), and of them the live ones (lease running, worker not gone:
   presence.py); at `Tenant.max_running`, or at its fair limit of the live worker slots
   while another tenant has work waiting now (presence.py, a max-min share; a tenant alone
   may use every slot), the occurrence is re-queued through the outbox (retry lane, short
   jittered delay, sooner for one deferred before), state unchanged: delayed, never failed,
   and the worker slot is free at once.
   Recovery work (catch-up lane, retries) is delayed the same way once it holds the slots
   left after the share reserved for on-time runs (presence.py, step 5).
   A claim that goes straight here (a fresh ALLOW run, not canceled, not late) took the
   tenant lock in step a's statement, after the row lock (`_LOCK_ROW`); the count and step d
   are then one statement (`_OPEN_ATTEMPT`) while the tenant is under its limit and share.
d. Insert the Attempt (fresh `lease_token`, `lease_expires_at`), occurrence → RUNNING. The
   transaction commits before the handler runs: from here on the lease is the only claim
   (heartbeat.py renews it, complete.py checks it, reaper.py takes it back). The handler's
   context carries the attempt's run-time limit (deadlines.py).
"""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from django.conf import settings
from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from apps.occurrences.execution.deadlines import effective_timeout_s
from apps.occurrences.execution.handlers import HandlerContext, RunOrigin
from apps.occurrences.execution.locks import (
    RECOVERY_KEY,
    RECOVERY_LOCK,
    SCHEDULE_LOCK,
    advisory_lock,
    overlap_lookback,
    tenant_lock,
    tenant_lock_sql,
)
from apps.occurrences.execution.presence import (
    LIVE_ATTEMPT,
    contention,
    fair_limit,
    live_capacity,
    recovery_slot_limit,
    tenant_slot_limit,
    worker_host,
)
from apps.occurrences.execution.registry import handler_spec
from apps.occurrences.execution.requeue import OutboxTarget, requeue_through_outbox
from apps.occurrences.execution.statements import (
    ATTEMPT_ROW_TABLE,
    OCCURRENCE_ROW_TABLE,
    execute_prepared,
    on_row_partitions,
)
from apps.occurrences.misfire import misfire_judge
from apps.occurrences.models import Attempt, Lane, Occurrence
from apps.occurrences.observability import metrics
from apps.occurrences.pipeline.relay import RELAY_CLOCK_SLACK
from apps.schedules.models import Schedule

CLAIMABLE = (
    Occurrence.State.SCHEDULED,
    Occurrence.State.ENQUEUED,
    Occurrence.State.RETRY_WAIT,
    Occurrence.State.WAITING,
)

_rng = random.SystemRandom()
# The actor of a `missed` event written by a claim.
MISFIRE_FOUND_BY = "worker"


class ClaimStatus(StrEnum):
    CLAIMED = "claimed"
    DUPLICATE = "duplicate"
    NOT_FOUND = "not_found"
    CANCELED = "canceled"
    SKIPPED_OVERLAP = "skipped_overlap"
    WAITING = "waiting"  # QUEUE_ONE: parked behind the running one
    DELAYED = "delayed"  # re-queued through the outbox (quota, or a retry behind a run)
    MISSED = "missed"  # found late: the misfire policy gave its instant up (misfire.py)


@dataclass(frozen=True)
class Claim:
    status: ClaimStatus
    context: HandlerContext | None = None
    attempt_id: uuid.UUID | None = None
    lease_token: uuid.UUID | None = None
    handler: str = ""
    shard: int = 0
    overlap_policy: str = Schedule.OverlapPolicy.ALLOW
    attempt_base: int = 0
    deadline_at: datetime | None = None
    retry_budget_per_hour: int = 0
    # The schedule's pause-after-DEAD setting and streak as claimed (failure_pause.py).
    pause_after_dead: int = 0
    dead_streak: int = 0


# Step a's statement. The tenant lock of step c is taken here, after the row lock (the
# locked row is materialized first, then each output row takes it), when the claim goes
# straight to step c: a fresh or enqueued occurrence of an ALLOW schedule, not canceled and
# not late (steps a', b and the currency check then have nothing to do under another lock).
# One round trip fewer per claim; any other claim takes it at step c as before.
# What a claim reads of the occurrence `o`, its schedule `s` and tenant `t`: `ClaimRow`'s
# fields after the key, in order (envelope_run.py reads the same).
CLAIM_ROW_COLUMNS = """
    o.state, o.schedule_version, o.attempt_count, o.tenant_id,
    o.attempt_base, o.deadline_at, o.cancel_requested_at IS NOT NULL AS cancel,
    s.id, s.state AS schedule_state, s.handler, s.payload::text, s.shard,
    s.overlap_policy, t.max_running, t.retry_budget_per_hour, o.enqueued_at,
    s.timeout_s, t.max_timeout_s, o.origin, o.available_at, s.max_lateness_s,
    coalesce(o.last_enqueued_at > o.enqueued_at, false), o.lane,
    s.pause_after_dead, s.dead_streak
"""
_LOCK_ROW = f"""
    WITH r AS MATERIALIZED (
        SELECT {CLAIM_ROW_COLUMNS}
        FROM {OCCURRENCE_ROW_TABLE} o
        JOIN schedules_schedule s ON s.id = o.schedule_id
        JOIN tenants_tenant t ON t.id = o.tenant_id
        WHERE o.id = %(id)s AND o.scheduled_for = %(at)s
        FOR UPDATE OF o
    )
    SELECT r.*, CASE
        WHEN r.state IN (%(scheduled)s, %(enqueued)s) AND r.overlap_policy = %(allow)s
         AND r.schedule_state <> %(canceled)s AND NOT r.cancel
         AND (r.attempt_count > 0 OR r.origin <> %(origin_scheduled)s
              OR %(now)s - r.available_at <= make_interval(secs => r.max_lateness_s))
        THEN {tenant_lock_sql("r.tenant_id")} ELSE false END
    FROM r
"""


@dataclass(frozen=True)
class ClaimRow:
    """The occurrence as step a locked it, with its schedule and tenant (after the key,
    fields in the order of `_LOCK_ROW`'s columns)."""

    occurrence_id: uuid.UUID
    scheduled_for: datetime
    state: str
    occurrence_version: int
    attempt_count: int
    tenant_id: uuid.UUID
    attempt_base: int
    deadline_at: datetime | None
    cancel_requested: bool
    schedule_id: uuid.UUID
    schedule_state: str
    handler: str
    payload: str
    shard: int
    overlap_policy: str
    max_running: int
    retry_budget_per_hour: int
    enqueued_at: datetime | None
    timeout_s: int | None
    max_timeout_s: int
    origin: str
    available_at: datetime
    max_lateness_s: int
    deferred_before: bool  # published again since its first confirm: a deferral, a redelivery
    lane: str
    pause_after_dead: int
    dead_streak: int
    tenant_locked: bool  # step a took the tenant lock (`_LOCK_ROW`)

    @property
    def target(self) -> OutboxTarget:
        return OutboxTarget(self.occurrence_id, self.scheduled_for, self.schedule_id,
                            self.occurrence_version, self.tenant_id, self.shard)  # fmt: skip


def occurrence_claim(
    *,
    occurrence_id: uuid.UUID,
    scheduled_for: datetime,
    worker_id: str,
    now: datetime | None = None,
) -> Claim:
    """Claim an occurrence for one attempt (module docstring, steps a-d)."""
    now = now or timezone.now()
    with transaction.atomic(), connection.cursor() as cursor:
        row = _lock_row(cursor, occurrence_id, scheduled_for, now)
        if row is None:
            return Claim(ClaimStatus.NOT_FOUND)
        for verdict_of in (_currency_verdict, _misfire_verdict, _overlap_verdict):
            verdict = verdict_of(cursor, row, now)
            if verdict is not None:
                return Claim(verdict)
        opened = _quota_and_open(cursor, row, worker_id, now)
        if isinstance(opened, ClaimStatus):
            return Claim(opened)
    return claimed(row, *opened)


def claimed(row: ClaimRow, attempt_no: int, attempt_id: uuid.UUID, lease_token: uuid.UUID) -> Claim:
    """The claim of `row`'s occurrence once its attempt is open (step d committed)."""
    context = HandlerContext(
        occurrence_id=row.occurrence_id,
        schedule_id=row.schedule_id,
        schedule_version=row.occurrence_version,
        tenant_id=row.tenant_id,
        scheduled_for=row.scheduled_for,
        attempt_no=attempt_no,
        payload=json.loads(row.payload),
        timeout_s=_timeout_of(row),
        origin=_run_origin(row),
    )
    return Claim(
        ClaimStatus.CLAIMED,
        context,
        attempt_id,
        lease_token,
        row.handler,
        row.shard,
        overlap_policy=row.overlap_policy,
        attempt_base=row.attempt_base,
        deadline_at=row.deadline_at,
        retry_budget_per_hour=row.retry_budget_per_hour,
        pause_after_dead=row.pause_after_dead,
        dead_streak=row.dead_streak,
    )


def _lock_row(
    cursor: CursorWrapper, occurrence_id: uuid.UUID, scheduled_for: datetime, now: datetime
) -> ClaimRow | None:
    """Step a's lock (and the tenant lock when it can be taken now, `_LOCK_ROW`)."""
    statement = on_row_partitions(_LOCK_ROW, scheduled_for, now)
    found = execute_prepared(cursor, statement, {
        "id": occurrence_id, "at": scheduled_for, "now": now,
        "scheduled": Occurrence.State.SCHEDULED, "enqueued": Occurrence.State.ENQUEUED,
        "allow": Schedule.OverlapPolicy.ALLOW, "canceled": Schedule.State.CANCELED,
        "origin_scheduled": Occurrence.Origin.SCHEDULED,
    }).fetchone()  # fmt: skip
    return None if found is None else ClaimRow(occurrence_id, scheduled_for, *found)


def _run_origin(row: ClaimRow) -> RunOrigin:
    """The occurrence's origin, or `replay` once a DLQ replay gave it a fresh attempt budget
    (replay.py sets `attempt_base`)."""
    return RunOrigin.REPLAY if row.attempt_base > 0 else RunOrigin(row.origin)


def _currency_verdict(cursor: CursorWrapper, row: ClaimRow, now: datetime) -> ClaimStatus | None:
    """Step a: a finished, running or recalled occurrence is a duplicate delivery; a canceled
    one ends here. None = still current."""
    if row.state not in CLAIMABLE or _timed_out_retry_pending(cursor, row, now):
        metrics.duplicate_claims.inc()
        return ClaimStatus.DUPLICATE
    if row.schedule_state == Schedule.State.CANCELED or row.cancel_requested:
        _finish(cursor, row, Occurrence.State.CANCELED, now)
        return ClaimStatus.CANCELED
    return None


def _misfire_verdict(cursor: CursorWrapper, row: ClaimRow, now: datetime) -> ClaimStatus | None:
    """Step a': a first attempt found later than the schedule's max lateness (an outage, a
    backlog, a message that waited in the queue) is judged by the misfire policy exactly as
    the materializer and the relay judge it (misfire.py): MISSED, or run in the catch-up
    lane. Only such a claim pays for the judgement."""
    if (
        row.attempt_count
        or row.origin != Occurrence.Origin.SCHEDULED
        or now - row.available_at <= timedelta(seconds=row.max_lateness_s)
    ):
        return None
    verdicts = misfire_judge(
        cursor, [(row.occurrence_id, row.scheduled_for)], now=now, found_by=MISFIRE_FOUND_BY
    )
    return ClaimStatus.MISSED if row.occurrence_id in verdicts.missed else None


def _timed_out_retry_pending(cursor: CursorWrapper, row: ClaimRow, now: datetime) -> bool:
    """A RETRY_WAIT occurrence whose last attempt TIMED_OUT and whose retry is not due yet:
    this delivery is that attempt's own message, handed back by the broker when its pool
    process was replaced (deadlines.py); running it would start the retry before its backoff
    and beside the retry's own message."""
    if row.state != Occurrence.State.RETRY_WAIT:
        return False
    # The schedule's shard narrows the outbox probe through outbox_due_idx.
    cursor.execute(
        """
        SELECT min(x.available_at) FROM occurrences_dispatchoutbox x
        WHERE x.shard = %(shard)s AND x.parked_at IS NULL
          AND x.occurrence_id = %(id)s AND x.scheduled_for = %(at)s
          AND EXISTS (
              SELECT 1 FROM occurrences_attempt a
              WHERE a.occurrence_id = %(id)s AND a.scheduled_for = %(at)s
                AND a.attempt_no = %(attempt_no)s AND a.outcome = %(timed_out)s
          )
        """,
        {"shard": row.shard, "id": row.occurrence_id, "at": row.scheduled_for,
         "attempt_no": row.attempt_count, "timed_out": Attempt.Outcome.TIMED_OUT},
    )  # fmt: skip
    found = cursor.fetchone()
    earliest = found[0] if found else None
    return earliest is not None and earliest > now + RELAY_CLOCK_SLACK


def _timeout_of(row: ClaimRow) -> int:
    """The attempt's run-time limit: the schedule's, else its handler's default, capped by
    the tenant's maximum (deadlines.py)."""
    spec = handler_spec(row.handler)
    return effective_timeout_s(
        requested_s=row.timeout_s,
        handler_default_s=spec.default_timeout_s if spec else row.max_timeout_s,
        tenant_max_s=row.max_timeout_s,
    )


def _finish(cursor: CursorWrapper, row: ClaimRow, state: Occurrence.State, now: datetime) -> None:
    cursor.execute(
        "UPDATE occurrences_occurrence SET state = %s, finished_at = %s "
        "WHERE id = %s AND scheduled_for = %s",
        [state, now, row.occurrence_id, row.scheduled_for],
    )


def _overlap_verdict(cursor: CursorWrapper, row: ClaimRow, now: datetime) -> ClaimStatus | None:
    """Step b, under the schedule lock; None = go on and run."""
    policy = row.overlap_policy
    if policy == Schedule.OverlapPolicy.ALLOW:
        return None
    advisory_lock(cursor, SCHEDULE_LOCK, row.schedule_id)
    running, waiting = _running_and_waiting(cursor, row, now)
    # A fresh run can be skipped; one that already started (a retry, a replay), the parked
    # QUEUE_ONE one or a backfilled instant (asked for one by one: docs/decisions.md "Run now
    # and backfill") must never be dropped, only delayed.
    fresh = (
        row.attempt_count == 0
        and row.state != Occurrence.State.WAITING
        and row.origin != Occurrence.Origin.BACKFILL
    )
    if policy == Schedule.OverlapPolicy.QUEUE_ONE:
        if row.state == Occurrence.State.WAITING:
            return _recheck_later(cursor, row, now, ClaimStatus.WAITING) if running else None
        if not (running or waiting):
            return None
        if running and not waiting and fresh:
            cursor.execute(
                "UPDATE occurrences_occurrence SET state = %s WHERE id = %s AND scheduled_for = %s",
                [Occurrence.State.WAITING, row.occurrence_id, row.scheduled_for],
            )
            return _recheck_later(cursor, row, now, ClaimStatus.WAITING)
    elif not running:
        return None
    if fresh:
        _finish(cursor, row, Occurrence.State.SKIPPED_OVERLAP, now)
        metrics.overlap_skips.labels(policy=policy).inc()
        return ClaimStatus.SKIPPED_OVERLAP
    return _recheck_later(cursor, row, now, ClaimStatus.DELAYED)


def _running_and_waiting(cursor: CursorWrapper, row: ClaimRow, now: datetime) -> tuple[int, int]:
    """How many other occurrences of the schedule are RUNNING, and how many WAITING."""
    cursor.execute(
        """
        SELECT count(*) FILTER (WHERE state = %(running)s),
               count(*) FILTER (WHERE state = %(waiting)s)
        FROM occurrences_occurrence
        WHERE schedule_id = %(schedule)s AND scheduled_for >= %(since)s
          AND state IN (%(running)s, %(waiting)s)
          AND NOT (id = %(occurrence)s AND scheduled_for = %(scheduled_for)s)
        """,
        {
            "running": Occurrence.State.RUNNING,
            "waiting": Occurrence.State.WAITING,
            "schedule": row.schedule_id,
            "since": overlap_lookback(now),
            "occurrence": row.occurrence_id,
            "scheduled_for": row.scheduled_for,
        },
    )
    counts = cursor.fetchone()
    return (int(counts[0]), int(counts[1])) if counts else (0, 0)


def _recheck_later(
    cursor: CursorWrapper, row: ClaimRow, now: datetime, status: ClaimStatus
) -> ClaimStatus:
    """Come back through the outbox after the re-check interval; the state stays as set."""
    recheck_at = now + timedelta(seconds=settings.TICK_OVERLAP_RECHECK_S)
    requeue_through_outbox(cursor, row.target, available_at=recheck_at, now=now)
    metrics.overlap_waits.inc()
    return status


# Deferred occurrences age: one deferred before asks again within `base_s`..2x`base_s`, a
# fresh arrival of a held tenant only after twice that, so a slot that frees up goes to the
# tenant's oldest deferred work ahead of each new minute's arrivals (docs/decisions.md, "No
# tenant can starve another"). Never later than DEFERRAL_CAP_S.
DEFERRAL_CAP_S = 30.0


def deferral_delay_s(
    waited_s: float, *, base_s: float, jitter: float, deferred_before: bool = True
) -> float:
    """Seconds until a deferred claim is tried again: `base_s` x (1 + `jitter`, in [0, 1))
    for an occurrence deferred before, twice that for a fresh arrival; at most
    DEFERRAL_CAP_S. `waited_s` is kept for the callers' logs and metrics."""
    delay = float(base_s) * (1 + jitter) * (1 if deferred_before else 2)
    return min(DEFERRAL_CAP_S, delay)


# The worker slots the tenant's live attempts (presence.LIVE_ATTEMPT) hold, and those its
# on-time ones (a first attempt outside the catch-up lane) hold: asked only by a claim at
# its share.
_TENANT_LIVE = f"""
    SELECT count(DISTINCT a.worker_id),
           count(DISTINCT a.worker_id)
               FILTER (WHERE a.attempt_no = 1 AND o.lane <> %(catchup_lane)s)
    FROM occurrences_attempt a
    JOIN occurrences_occurrence o ON o.id = a.occurrence_id AND o.scheduled_for = a.scheduled_for
    WHERE a.tenant_id = %(tenant)s AND {LIVE_ATTEMPT}
"""


def _quota_and_open(
    cursor: CursorWrapper, row: ClaimRow, worker_id: str, now: datetime
) -> ClaimStatus | tuple[int, uuid.UUID, uuid.UUID]:
    """Steps c and d under the tenant lock: the common claim - on time and under both the
    tenant's `max_running` and its guaranteed share - counts, inserts its attempt and moves
    the occurrence to RUNNING in one statement (`_OPEN_ATTEMPT`); any other claim gets the
    count from that statement and is judged by `_quota_verdict`, then opens as before."""
    share = tenant_slot_limit()  # cached per process: read before the lock, not under it
    if not row.tenant_locked:
        tenant_lock(cursor, row.tenant_id)
    bound = min(row.max_running, row.max_running if share is None else share)
    running, opened = _open_attempt(
        cursor, row, worker_id, now, below=bound if _on_time(row) else 0
    )
    if opened is not None:
        return opened
    verdict = _quota_verdict(cursor, row, now, running=running, share=share, worker_id=worker_id)
    if verdict is not None:
        return verdict
    _, opened = _open_attempt(cursor, row, worker_id, now, below=None)
    assert opened is not None
    return opened


def _quota_verdict(
    cursor: CursorWrapper,
    row: ClaimRow,
    now: datetime,
    *,
    running: int,
    share: int | None,
    worker_id: str,
) -> ClaimStatus | None:
    """Step c, under the tenant lock, given the worker slots the tenant's open attempts hold:
    at its run limit (`max_running`, or its fair share of the live worker slots while another
    tenant has work waiting), delay; None = run."""
    if running >= row.max_running:
        delayed = metrics.quota_delays
    # Asked only at the guaranteed share (a claim under it, the common case, skips both
    # reads); the snapshot is cached per process, so under the lock it costs a query at most
    # once a second.
    elif (
        share is not None
        and running >= share
        and _held_to_share(cursor, row.tenant_id, share, on_time=_on_time(row))
    ):
        delayed = metrics.fair_share_delays
    elif not _on_time(row) and _recovery_full(cursor, worker_id):
        delayed = metrics.strict_reserve_delays
    else:
        return None
    waiting_since = row.enqueued_at or row.scheduled_for
    waited_s = (now - waiting_since).total_seconds()
    delay = deferral_delay_s(
        waited_s, base_s=settings.TICK_QUOTA_DELAY_S, jitter=_rng.random(),
        deferred_before=row.deferred_before,
    )  # fmt: skip
    requeue_through_outbox(cursor, row.target, available_at=now + timedelta(seconds=delay), now=now)
    delayed.inc()
    if delayed is metrics.fair_share_delays and waited_s > settings.TICK_DEFERRAL_ALERT_S:
        snapshot = contention()
        capacity = live_capacity()
        if capacity is not None and snapshot.running_total < capacity:
            # Deferred this long while a slot was free: the share failed to conserve work.
            metrics.deferred_beside_free_slots.inc()
    return ClaimStatus.DELAYED


# Recovery work running now (presence.LIVE_ATTEMPT): catch-up lane runs and retries, in all
# and on the claiming worker (worker_id = "<hostname>:<pid>", tasks.py), with that worker's
# live slots (NULL: it has not announced itself).
_RECOVERY_RUNNING = f"""
    SELECT count(*),
           count(*) FILTER (WHERE left(a.worker_id, length(%(host)s) + 1) = %(host)s || ':'),
           (SELECT p.slots FROM occurrences_workerpresence p
            WHERE p.hostname = %(host)s
              AND p.seen_at > now() - make_interval(secs => %(presence_ttl_s)s))
    FROM occurrences_attempt a
    JOIN occurrences_occurrence o ON o.id = a.occurrence_id AND o.scheduled_for = a.scheduled_for
    WHERE {LIVE_ATTEMPT} AND (a.attempt_no > 1 OR o.lane = %(catchup_lane)s)
"""


def _recovery_full(cursor: CursorWrapper, worker_id: str) -> bool:
    """Whether recovery work already holds every slot it may (presence.py, step 5), in all
    or on the claiming worker: counted fresh under RECOVERY_LOCK - recovery claims are few
    (paced by the catch-up rates), and a per-process cached count let four claims at once
    take every slot."""
    capacity = live_capacity()
    if capacity is None:
        return False
    advisory_lock(cursor, RECOVERY_LOCK, RECOVERY_KEY)
    cursor.execute(_RECOVERY_RUNNING, {
        "presence_ttl_s": settings.TICK_WORKER_PRESENCE_TTL_S, "catchup_lane": Lane.CATCHUP,
        "host": worker_host(worker_id),
    })  # fmt: skip
    found = cursor.fetchone()
    if found is None:
        return False
    running, on_this_worker, worker_slots = found
    if int(running) >= recovery_slot_limit(capacity):
        return True
    return worker_slots is not None and int(on_this_worker) >= recovery_slot_limit(worker_slots)


def _on_time(row: ClaimRow) -> bool:
    """An on-time claim: a first attempt outside the catch-up lane (presence.py, step 6)."""
    return row.lane != Lane.CATCHUP and not row.attempt_count


def _held_to_share(
    cursor: CursorWrapper, tenant_id: uuid.UUID, share: int, *, on_time: bool
) -> bool:
    """Whether the tenant's live slots reach its guaranteed `share` and its fair limit
    while another tenant has work waiting (presence.py, step 4); an on-time claim counts and
    answers to on-time work only (step 6)."""
    capacity = live_capacity()
    if capacity is None:
        return False
    cursor.execute(_TENANT_LIVE, {
        "tenant": tenant_id, "presence_ttl_s": settings.TICK_WORKER_PRESENCE_TTL_S,
        "catchup_lane": Lane.CATCHUP,
    })  # fmt: skip
    found = cursor.fetchone()
    live = (int(found[1]) if on_time else int(found[0])) if found else 0
    if live < share:
        return False
    snapshot = contention()
    limit = fair_limit(tenant_id, capacity, snapshot.on_time() if on_time else snapshot)
    return limit is not None and live >= limit


# Steps c and d in one statement (the snapshot is taken after the tenant lock, which the
# previous statement took): the worker slots the tenant's open attempts hold and, only while
# they are under `below` (NULL: no bound, the claim was judged already), the attempt with a
# fresh lease and the occurrence's move to RUNNING. The attempt's foreign key to the
# occurrence is checked at the end of the statement, after the update.
_OPEN_ATTEMPT = f"""
    WITH running AS (
        SELECT count(DISTINCT worker_id) AS n FROM occurrences_attempt
        WHERE tenant_id = %(tenant)s AND finished_at IS NULL
    ), attempt AS (
        INSERT INTO {ATTEMPT_ROW_TABLE}
            (id, scheduled_for, occurrence_id, tenant_id, attempt_no, lease_token,
             lease_expires_at, worker_id, started_at, finished_at, outcome,
             error_class, error_message)
        SELECT %(attempt)s, %(at)s, %(id)s, %(tenant)s, %(attempt_no)s, %(token)s,
               %(expires)s, %(worker)s, %(now)s, NULL, '', '', ''
        FROM running WHERE %(below)s::int IS NULL OR running.n < %(below)s::int
        RETURNING 1
    ), occurrence AS (
        UPDATE {OCCURRENCE_ROW_TABLE}
        SET state = %(running_state)s, attempt_count = %(attempt_no)s
        WHERE id = %(id)s AND scheduled_for = %(at)s AND EXISTS (SELECT 1 FROM attempt)
        RETURNING lane, available_at
    )
    SELECT running.n, occurrence.lane, occurrence.available_at
    FROM running LEFT JOIN occurrence ON true
"""


def _open_attempt(
    cursor: CursorWrapper, row: ClaimRow, worker_id: str, now: datetime, *, below: int | None
) -> tuple[int, tuple[int, uuid.UUID, uuid.UUID] | None]:
    """Step d, while the slots the tenant's open attempts hold are under `below` (None:
    unconditionally): returns (slots held before it, (attempt_no, id, lease token) or None
    when not opened)."""
    attempt_no = row.attempt_count + 1
    attempt_id, lease_token = uuid.uuid4(), uuid.uuid4()
    statement = on_row_partitions(_OPEN_ATTEMPT, row.scheduled_for, now)
    opened = execute_prepared(cursor, statement, {
        "tenant": row.tenant_id, "attempt": attempt_id, "at": row.scheduled_for,
        "id": row.occurrence_id, "attempt_no": attempt_no, "token": lease_token,
        "expires": now + timedelta(seconds=settings.TICK_ATTEMPT_LEASE_S),
        "worker": worker_id[:200], "now": now, "below": below,
        "running_state": Occurrence.State.RUNNING,
    })  # fmt: skip
    running, lane, available_at = opened.fetchone()
    if lane is None:
        return int(running), None
    observe_start(row, now, lane=lane, available_at=available_at)
    return int(running), (attempt_no, attempt_id, lease_token)


def observe_start(row: ClaimRow, now: datetime, *, lane: str, available_at: datetime) -> None:
    if row.state == Occurrence.State.ENQUEUED and row.enqueued_at is not None:
        wait = (now - row.enqueued_at).total_seconds()
        metrics.occurrence_state_seconds.labels(state=Occurrence.State.ENQUEUED).observe(
            max(wait, 0.0)
        )
    # A retry starts late by design, and an asked-for run (run now, backfill) is not late
    # (docs/operations.md "Metrics").
    if row.attempt_count == 0 and row.origin == Occurrence.Origin.SCHEDULED:
        metrics.observe_start_lag(
            lane, scheduled_for=row.scheduled_for, available_at=available_at, started_at=now
        )
