"""Runs asked for by someone beside the timetable: run now and backfill
(docs/decisions.md "Run now and backfill").

Both write occurrences and their outbox rows in one statement (set-based, like the
materializer) and record the request in the schedule's history through
`apps.schedules.services.log_event`, in one transaction that holds the schedule row
FOR UPDATE (`lock_schedule`): the same lock as the materializer's batch and every lifecycle
change, so a concurrent pause, update or cancel sees the new rows or refuses first.

Ids are deterministic, so a retried request never runs twice:
- run now: `uuid5(ns, "<schedule>:run-now:<request id>")`; the row is due now, so the
  retry finds it (by id, within `TICK_IDEMPOTENCY_TTL_S`) under the schedule lock and answers
  the first receipt again;
- backfill: `uuid5(ns, "<schedule>:backfill:<instant>")`; the insert is `ON CONFLICT DO
  NOTHING` on the primary key, so an instant is backfilled at most once, whatever the ranges.

Who runs what: run now goes through the strict lane (the trigger-rate quota of the relay,
the run quota and overlap policy of the claim); backfill through the catch-up lane (the
tenant's catch-up rate). Under SKIP_IF_RUNNING a run now that finds a run in progress is
recorded SKIPPED_OVERLAP at once, with its reason in the receipt and the event; the claim
checks again when it arrives. A backfilled instant is never skipped for overlap, only
delayed (claim.py): each was asked for by name.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import TextChoices
from django.utils import timezone

from apps.occurrences.execution.locks import overlap_lookback
from apps.occurrences.models import OCCURRENCE_NAMESPACE, Lane, Occurrence
from apps.occurrences.pipeline.bulk import text_array
from apps.occurrences.pipeline.outbox import outbox_insert
from apps.occurrences.pipeline.partitions import (
    partitions_absent,
    partitions_ensure,
    partitions_missing,
)
from apps.schedules import timerules
from apps.schedules.errors import LifecycleError, StateConflict
from apps.schedules.models import Schedule, ScheduleEvent
from apps.schedules.services import lock_schedule, log_event, rule_times_between
from apps.tenants import rls

ONE_MICROSECOND = timedelta(microseconds=1)
# A receipt lists at most this many occurrence ids (its counts are always complete).
RECEIPT_LIMIT = 1000
SKIPPED_WHILE_RUNNING = (
    "Skipped: another occurrence of this schedule is running and its overlap policy is "
    "skip_if_running."
)


class BackfillOnly(TextChoices):
    """Which instants of the range a backfill runs."""

    MISSED = "missed", "Missed (no run, or MISSED / skipped / canceled)"
    FAILED = "failed", "Failed (DEAD)"
    ALL = "all", "All (also the ones that succeeded)"


class Outcome(TextChoices):
    """What became of one instant of the timetable, as a backfill sees it."""

    MISSED = "missed"
    FAILED = "failed"
    SUCCEEDED = "succeeded"
    # Pending, running or waiting to retry: it may still run; never doubled.
    IN_FLIGHT = "in_flight"
    # At or after the materializer's frontier: not decided yet (the misfire policy decides
    # it, also at resume); backfilling it could run it twice.
    NOT_MATERIALIZED = "not_materialized"


_RUNS: dict[str, tuple[Outcome, ...]] = {
    BackfillOnly.MISSED: (Outcome.MISSED,),
    BackfillOnly.FAILED: (Outcome.FAILED,),
    BackfillOnly.ALL: (Outcome.MISSED, Outcome.FAILED, Outcome.SUCCEEDED),
}
_IN_FLIGHT = (
    Occurrence.State.SCHEDULED,
    Occurrence.State.ENQUEUED,
    Occurrence.State.RUNNING,
    Occurrence.State.RETRY_WAIT,
    Occurrence.State.WAITING,
)


class RunNowTooOften(LifecycleError, status=429, code="rate_limited"):
    """More run-now requests for one schedule within a minute than TICK_RUN_NOW_PER_MIN."""


class BackfillTooLarge(LifecycleError, status=400, code="backfill_too_large"):
    """The range holds more instants of the schedule than one backfill runs."""


class NoStorageForDay(LifecycleError, status=409, code="no_partition"):
    """An instant falls on a day Tick keeps no occurrence partition for (before its stored
    history, or today's not created yet because the materializer is not running)."""


def _partitions_ready(days: set[date]) -> None:
    """The days' partitions exist. A web request (row-level security active) may not create
    tables: a missing day is refused; the engine's own callers create it."""
    missing = partitions_missing(days)
    if not missing:
        return
    if not rls.active():
        partitions_ensure(missing)
        return
    absent = partitions_absent(missing)
    if absent:
        listed = ", ".join(str(day) for day in sorted(absent)[:5])
        raise NoStorageForDay(f"Tick keeps no occurrences for {listed}: nothing can run there.")


def run_now_occurrence_id(schedule_id: uuid.UUID, request_id: str) -> uuid.UUID:
    return uuid.uuid5(OCCURRENCE_NAMESPACE, f"{schedule_id}:run-now:{request_id}")


def backfill_occurrence_id(schedule_id: uuid.UUID, instant: datetime) -> uuid.UUID:
    text = instant.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return uuid.uuid5(OCCURRENCE_NAMESPACE, f"{schedule_id}:backfill:{text}")


@dataclass(frozen=True)
class RunNowReceipt:
    action: ScheduleEvent.Kind
    at: datetime
    version: int
    occurrence: uuid.UUID
    scheduled_for: datetime
    lane: Lane
    state: Occurrence.State
    request_id: str
    # True when this request id had already run: nothing new was created.
    replayed: bool
    reason: str = ""


@dataclass(frozen=True)
class BackfillReceipt:
    action: ScheduleEvent.Kind
    at: datetime
    version: int
    start: datetime
    end: datetime
    only: BackfillOnly
    dry_run: bool
    lane: Lane
    instants: int
    queued: int
    already_done: int
    skipped: dict[str, int]
    first: datetime | None
    last: datetime | None
    occurrences: list[uuid.UUID] = field(default_factory=list)


# The outbox rows of the occurrences just inserted that are due to run.
_NEW_ROWS_OUTBOX = outbox_insert(
    occurrence_id="id", schedule_id="%(schedule)s", schedule_version="%(version)s",
    tenant_id="%(tenant)s", shard="%(shard)s", lane="%(lane)s", available_at="%(now)s",
    source="FROM ins WHERE state = %(scheduled)s", returning="RETURNING 1",
)  # fmt: skip

# One statement for both: the occurrences and, for those inserted and due to run, their
# outbox rows (the materializer's pattern; nothing is published that was not inserted).
_INSERT = f"""
    WITH rows AS (
        SELECT * FROM unnest(%(id)s::uuid[], %(at)s::timestamptz[], %(state)s::text[])
            AS r(id, scheduled_for, state)
    ),
    ins AS (
        INSERT INTO occurrences_occurrence
            (id, scheduled_for, schedule_id, schedule_version, tenant_id, lane, state,
             available_at, attempt_count, created_at, finished_at, deadline_at, origin,
             requested_by)
        SELECT id, scheduled_for, %(schedule)s, %(version)s, %(tenant)s, %(lane)s, state,
               %(now)s, 0, %(now)s,
               CASE WHEN state = %(scheduled)s THEN NULL ELSE %(now)s::timestamptz END,
               %(deadline)s, %(origin)s, %(actor)s
        FROM rows
        ON CONFLICT DO NOTHING
        RETURNING id, scheduled_for, state
    ),
    outbox AS ({_NEW_ROWS_OUTBOX})
    SELECT id FROM ins ORDER BY scheduled_for
"""


def _insert(
    schedule: Schedule,
    rows: Sequence[tuple[uuid.UUID, datetime, Occurrence.State]],
    *,
    lane: Lane,
    origin: Occurrence.Origin,
    actor: str,
    now: datetime,
) -> list[uuid.UUID]:
    """Insert `rows` (id, instant, state); returns the ids actually inserted."""
    deadline = now + timedelta(seconds=settings.TICK_RETRY_DEADLINE_S)
    with connection.cursor() as cursor:
        cursor.execute(_INSERT, {
            "id": text_array(r[0] for r in rows), "at": text_array(r[1] for r in rows),
            "state": text_array(str(r[2]) for r in rows), "schedule": schedule.id,
            "version": schedule.version, "tenant": schedule.tenant_id, "shard": schedule.shard,
            "lane": str(lane), "now": now, "deadline": deadline, "origin": str(origin),
            "actor": actor[:200], "scheduled": str(Occurrence.State.SCHEDULED),
        })  # fmt: skip
        return [row[0] for row in cursor.fetchall()]


def _refuse_canceled(schedule: Schedule, what: str) -> None:
    # A canceled schedule is over for good; the claim would cancel the run anyway. A paused
    # or completed one may run on request: the request is explicit, unlike the timetable.
    if schedule.state == Schedule.State.CANCELED:
        raise StateConflict(f"Schedule is canceled: it never runs again, so it cannot {what}.")


# --------------------------------------------------------------------------------------------
# Run now
# --------------------------------------------------------------------------------------------

_FIND_RUN = """
    SELECT scheduled_for, lane, state FROM occurrences_occurrence
    WHERE id = %(id)s AND schedule_id = %(schedule)s AND scheduled_for >= %(since)s
"""
_RUNNING = """
    SELECT 1 FROM occurrences_occurrence
    WHERE schedule_id = %(schedule)s AND scheduled_for >= %(since)s AND state = %(running)s
    LIMIT 1
"""


# The schedule's run-now occurrences of the last minute (they are due when asked for, so
# `scheduled_for` is their request time); the schedule/time index, today's partitions only.
_RECENT_RUNS_NOW = """
    SELECT scheduled_for FROM occurrences_occurrence
    WHERE schedule_id = %(schedule)s AND scheduled_for > %(since)s AND origin = %(manual)s
    ORDER BY scheduled_for LIMIT %(limit)s
"""


def _refuse_too_often(schedule: Schedule, now: datetime) -> None:
    """Under the schedule lock: refuse a run now beyond TICK_RUN_NOW_PER_MIN in the last
    minute, with the seconds until the oldest of them leaves the minute."""
    limit = settings.TICK_RUN_NOW_PER_MIN
    with connection.cursor() as cursor:
        cursor.execute(_RECENT_RUNS_NOW, {
            "schedule": schedule.id, "since": now - timedelta(minutes=1),
            "manual": str(Occurrence.Origin.MANUAL), "limit": limit,
        })  # fmt: skip
        recent = [row[0] for row in cursor.fetchall()]
    if len(recent) < limit:
        return
    wait = recent[0] + timedelta(minutes=1) - now
    raise RunNowTooOften(
        f"This schedule was run now {limit} times in the last minute, the most it accepts; "
        "try again shortly.",
        retry_after_s=max(1, int(wait.total_seconds()) + 1),
    )


def _reason_of(state: str) -> str:
    return SKIPPED_WHILE_RUNNING if state == Occurrence.State.SKIPPED_OVERLAP else ""


def _running_now(schedule: Schedule, now: datetime) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(_RUNNING, {"schedule": schedule.id, "since": overlap_lookback(now),
                                  "running": Occurrence.State.RUNNING})  # fmt: skip
        return cursor.fetchone() is not None


def schedule_run_now(
    *, schedule: Schedule, actor: str, request_id: str, now: datetime | None = None
) -> RunNowReceipt:
    """One extra occurrence of `schedule`, due now on the strict lane (module docstring).

    1. Make sure today's partition exists (DDL outside the transaction).
    2. Lock the schedule; refuse a canceled one (409).
    3. The request id's occurrence already exists: answer its receipt again (replayed).
       Beyond TICK_RUN_NOW_PER_MIN new runs of the schedule in the last minute: 429.
    4. Under SKIP_IF_RUNNING with a run in progress: record it SKIPPED_OVERLAP, no outbox row.
       Otherwise SCHEDULED with an outbox row due now.
    5. Log RUN_NOW with the actor, the request id and the outcome.
    """
    now = now or timezone.now()
    _partitions_ready({now.date()})
    occurrence_id = run_now_occurrence_id(schedule.id, request_id)
    with transaction.atomic():
        locked = lock_schedule(schedule)
        _refuse_canceled(locked, "run now")
        with connection.cursor() as cursor:
            since = now - timedelta(seconds=settings.TICK_IDEMPOTENCY_TTL_S)
            cursor.execute(_FIND_RUN, {"id": occurrence_id, "schedule": locked.id, "since": since})
            found = cursor.fetchone()
        if found is not None:
            return RunNowReceipt(
                ScheduleEvent.Kind.RUN_NOW, now, locked.version, occurrence_id, found[0],
                Lane(found[1]), Occurrence.State(found[2]), request_id, True, _reason_of(found[2]),
            )  # fmt: skip
        _refuse_too_often(locked, now)
        state = Occurrence.State.SCHEDULED
        if locked.overlap_policy == Schedule.OverlapPolicy.SKIP_IF_RUNNING and _running_now(
            locked, now
        ):
            state = Occurrence.State.SKIPPED_OVERLAP
        rows = [(occurrence_id, now, state)]
        _insert(locked, rows, lane=Lane.STRICT, origin=Occurrence.Origin.MANUAL,
                actor=actor, now=now)  # fmt: skip
        reason = _reason_of(state)
        detail = {"occurrence": str(occurrence_id), "request_id": request_id, "state": str(state)}
        if reason:
            detail["reason"] = reason
        log_event(locked, ScheduleEvent.Kind.RUN_NOW, actor, now, **detail)
    return RunNowReceipt(ScheduleEvent.Kind.RUN_NOW, now, locked.version, occurrence_id, now,
                         Lane.STRICT, state, request_id, False, reason)  # fmt: skip


# --------------------------------------------------------------------------------------------
# Backfill
# --------------------------------------------------------------------------------------------

# Every occurrence of the schedule at the given instants, of any version and origin; the
# explicit range keeps the read to the range's day partitions.
_AT_INSTANTS = """
    SELECT scheduled_for, origin, state FROM occurrences_occurrence
    WHERE schedule_id = %(schedule)s AND scheduled_for >= %(lo)s AND scheduled_for < %(hi)s
      AND scheduled_for = ANY(%(at)s::timestamptz[])
"""


def backfill_instants(*, schedule: Schedule, start: datetime, end: datetime) -> list[datetime]:
    """The rule's instants in [start, end) within the schedule's own start_at/end_at, from
    the time rules module; at most TICK_BACKFILL_MAX_INSTANTS, else BackfillTooLarge."""
    limit = settings.TICK_BACKFILL_MAX_INSTANTS
    lo = max(start, schedule.start_at) if schedule.start_at else start
    hi = min(end, schedule.end_at) if schedule.end_at else end
    if lo >= hi:
        return []
    if schedule.kind == Schedule.Kind.ONE_SHOT:
        run_at = schedule.run_at
        return [run_at] if run_at is not None and lo <= run_at < hi else []
    found = rule_times_between(
        schedule, lo - ONE_MICROSECOND, hi - ONE_MICROSECOND, limit=limit + 1
    )
    if len(found) > limit:
        raise BackfillTooLarge(
            f"This range holds more than {limit} instants of the schedule; one backfill "
            f"runs at most {limit}. Split the range.",
            field="to",
        )
    return found


def _outcome(instant: datetime, states: list[str], frontier: datetime | None) -> Outcome:
    if any(state in _IN_FLIGHT for state in states):
        return Outcome.IN_FLIGHT
    if Occurrence.State.SUCCEEDED in states:
        return Outcome.SUCCEEDED
    if Occurrence.State.DEAD in states:
        return Outcome.FAILED
    if not states and frontier is not None and instant >= frontier:
        return Outcome.NOT_MATERIALIZED
    return Outcome.MISSED  # never produced, or MISSED / SKIPPED_OVERLAP / CANCELED / SUPERSEDED


def _classify(
    schedule: Schedule, instants: list[datetime], only: BackfillOnly
) -> tuple[list[datetime], int, Counter[str]]:
    """Split the instants into those to run, those already backfilled, and the skipped ones
    (counted by their outcome)."""
    if not instants:
        return [], 0, Counter()
    with connection.cursor() as cursor:
        cursor.execute(_AT_INSTANTS, {
            "schedule": schedule.id, "lo": instants[0], "hi": instants[-1] + ONE_MICROSECOND,
            "at": text_array(instants),
        })  # fmt: skip
        backfilled: set[datetime] = set()
        states: dict[datetime, list[str]] = {}
        for at, origin, state in cursor.fetchall():
            if origin == Occurrence.Origin.BACKFILL:
                backfilled.add(at)
            elif origin == Occurrence.Origin.SCHEDULED:
                states.setdefault(at, []).append(state)
    to_run: list[datetime] = []
    skipped: Counter[str] = Counter()
    for instant in instants:
        if instant in backfilled:
            continue
        outcome = _outcome(instant, states.get(instant, []), schedule.next_run_at)
        if outcome in _RUNS[only]:
            to_run.append(instant)
        else:
            skipped[str(outcome)] += 1
    return to_run, len(backfilled), skipped


def schedule_backfill(
    *,
    schedule: Schedule,
    actor: str,
    start: datetime,
    end: datetime,
    only: BackfillOnly,
    dry_run: bool = False,
    now: datetime | None = None,
) -> BackfillReceipt:
    """Run the rule's instants in [start, end) that `only` selects (module docstring).

    The caller validated the range (end not in the future, start within retention).
    1. The instants from the time rules module (at most TICK_BACKFILL_MAX_INSTANTS: 400).
    2. Their partitions exist (DDL outside the transaction).
    3. Lock the schedule; refuse a canceled one (409); classify each instant by what became
       of it; insert the selected ones in one statement on the catch-up lane, due now.
    4. Log BACKFILLED with the range and the counts. A dry run stops after classifying.
    """
    now = now or timezone.now()
    instants = backfill_instants(schedule=schedule, start=start, end=end)
    if not dry_run and instants:
        _partitions_ready({instant.date() for instant in instants})
    with transaction.atomic():
        locked = schedule if dry_run else lock_schedule(schedule)
        _refuse_canceled(locked, "be backfilled")
        to_run, already_done, skipped = _classify(locked, instants, only)
        ids = [backfill_occurrence_id(locked.id, instant) for instant in to_run]
        if not dry_run and to_run:
            rows = [(i, at, Occurrence.State.SCHEDULED) for i, at in zip(ids, to_run, strict=True)]
            inserted = _insert(locked, rows, lane=Lane.CATCHUP, origin=Occurrence.Origin.BACKFILL,
                               actor=actor, now=now)  # fmt: skip
            # A backfill of the same instant committed meanwhile is not counted twice.
            already_done += len(ids) - len(inserted)
            ids = inserted
        receipt = BackfillReceipt(
            ScheduleEvent.Kind.BACKFILLED, now, locked.version, start, end, only, dry_run,
            Lane.CATCHUP, len(instants), len(ids), already_done, dict(skipped),
            to_run[0] if to_run else None, to_run[-1] if to_run else None, ids[:RECEIPT_LIMIT],
        )  # fmt: skip
        if not dry_run:
            log_event(locked, ScheduleEvent.Kind.BACKFILLED, actor, now,
                      start=timerules.instant_text(start), end=timerules.instant_text(end),
                      only=str(only), instants=len(instants), queued=len(ids),
                      already_done=already_done, skipped=dict(skipped))  # fmt: skip
    return receipt
