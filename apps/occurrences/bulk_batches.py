"""Set-based pause, resume and cancel of a run of schedules that have nothing to recall
(docs/decisions.md "Bulk changes: …"), for bulk_changes.py.

A run is worked in the caller's transaction with a fixed number of statements whatever its
length: lock the run's rows (id order), find which have outbox rows the single verb would
delete (those need its recall and relay barrier: the run stops before the first of them),
count what is still in flight for each schedule's receipt, then the state change, the
version interval (cancel), the restore of what the last pause canceled (resume: the single
verb's own statement, `restore_canceled`) and the events, one statement each. Each schedule
ends as the single verb (schedule_changes.py) would leave it: the same state, columns, event
and detail; versions unchanged; no alert (the single verbs record none); a refusal with the
single verb's code and message.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from apps.occurrences.models import BulkChange
from apps.occurrences.schedule_changes import (
    FINISHED,
    IN_FLIGHT,
    PAUSE_KEEPS,
    RECEIPT_LIMIT,
    enum_values,
    refuse_unless,
    restore_canceled,
    schedule_columns,
)
from apps.schedules.errors import StateConflict
from apps.schedules.models import Schedule, ScheduleEvent

Verb = BulkChange.Verb
State = Schedule.State

# What each verb finds in each state: changes it, finds it already so, or refuses it (the
# single verb's 409). Pause and resume refuse the rest; cancel changes every other state.
ALREADY: dict[str, tuple[State, ...]] = {
    Verb.PAUSE: (State.PAUSED,),
    Verb.RESUME: (State.ACTIVE,),
    Verb.CANCEL: (State.CANCELED,),
    Verb.RUN_NOW: (),
}
CHANGES: dict[str, tuple[State, ...]] = {
    Verb.PAUSE: (State.ACTIVE,),
    Verb.RESUME: (State.PAUSED,),
    Verb.CANCEL: (State.ACTIVE, State.PAUSED, State.COMPLETED),
    Verb.RUN_NOW: (State.ACTIVE, State.PAUSED, State.COMPLETED),
}
# Outbox lanes each recalling verb leaves alone (schedule_pause, schedule_cancel).
_KEEPS: dict[str, tuple[str, ...]] = {Verb.PAUSE: PAUSE_KEEPS, Verb.CANCEL: ()}
_REFUSES: dict[str, tuple[State, str]] = {
    Verb.PAUSE: (State.ACTIVE, "paused"),
    Verb.RESUME: (State.PAUSED, "resumed"),
}

# The schedules with an outbox row the single verb's recall would delete (its
# `_HAS_RECALLABLE`, for many schedules at once).
_RECALLABLE = """
    SELECT DISTINCT o.schedule_id FROM occurrences_dispatchoutbox o
    JOIN unnest(%(ids)s::uuid[], %(shards)s::int[], %(versions)s::int[]) AS s(id, shard, version)
      ON o.shard = s.shard AND o.schedule_id = s.id AND o.schedule_version <= s.version
    WHERE NOT (o.lane = ANY(%(keep_lanes)s::text[]))
"""

# The receipt's not-recalled count per schedule (the single verb's `_NOT_RECALLED`, counted).
_NOT_RECALLED = """
    SELECT schedule_id, least(count(*), %(limit)s) FROM occurrences_occurrence
    WHERE schedule_id = ANY(%(ids)s::uuid[]) AND scheduled_for >= %(since)s
      AND (state = ANY(%(in_flight)s::text[])
           OR (scheduled_for >= %(now)s AND state = ANY(%(finished)s::text[])))
    GROUP BY schedule_id
"""

_PAUSE = "UPDATE schedules_schedule SET state = %(paused)s, updated_at = %(now)s WHERE id = ANY(%(ids)s::uuid[])"  # noqa: E501
_RESUME = """
    UPDATE schedules_schedule
    SET state = CASE WHEN next_run_at IS NULL THEN %(completed)s ELSE %(active)s END,
        dead_streak = 0, updated_at = %(now)s
    WHERE id = ANY(%(ids)s::uuid[])
"""
_CANCEL = """
    UPDATE schedules_schedule SET state = %(canceled)s, next_run_at = NULL, updated_at = %(now)s
    WHERE id = ANY(%(ids)s::uuid[])
"""
_CLOSE_VERSIONS = """
    UPDATE schedules_scheduleversion SET valid_to = %(now)s
    WHERE schedule_id = ANY(%(ids)s::uuid[]) AND valid_to IS NULL
"""


# Whether the relay has rows due for a while and not yet published: one probe of
# outbox_due_idx per shard, each stopping at its first row.
_RELAY_BEHIND = """
    SELECT EXISTS (
        SELECT 1 FROM generate_series(0, %(shards)s - 1) AS s(shard)
        WHERE EXISTS (
            SELECT 1 FROM occurrences_dispatchoutbox o
            WHERE o.shard = s.shard AND o.parked_at IS NULL AND o.available_at <= %(due)s
        )
    )
"""


def relay_behind(*, late_s: float = 1.0) -> bool:
    """Whether an outbox row was due `late_s` ago and is still waiting for the relay."""
    with connection.cursor() as cursor:
        cursor.execute(_RELAY_BEHIND, {
            "shards": settings.TICK_SHARDS, "due": timezone.now() - timedelta(seconds=late_s),
        })  # fmt: skip
        row = cursor.fetchone()
    return bool(row and row[0])


@dataclass
class RunOutcome:
    """What a set-based run did: the first `handled` schedules of the run (in its order) are
    counted; the one after them, if any, has something to recall."""

    handled: int = 0
    changed: int = 0
    already: int = 0
    refusals: list[dict[str, str]] = field(default_factory=list)


def recallable(verb: str, schedules: Sequence[Schedule]) -> set[uuid.UUID]:
    """The schedules (as given; lock them for a firm answer) whose change by `verb` would
    recall outbox rows. Resume recalls nothing."""
    if verb not in _KEEPS or not schedules:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(
            _RECALLABLE, {**schedule_columns(schedules), "keep_lanes": enum_values(_KEEPS[verb])}
        )
        return {row[0] for row in cursor.fetchall()}


def _refusal(verb: str, schedule: Schedule) -> dict[str, str]:
    state, change = _REFUSES[verb]
    try:
        refuse_unless(schedule, state, change)
    except StateConflict as err:
        return {"id": str(schedule.id), "code": err.code, "message": err.message}
    raise AssertionError(f"{schedule.state} is no refusal of {verb}")


def _per_schedule(sql: str, params: dict[str, Any]) -> dict[uuid.UUID, int]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {row[0]: int(row[1]) for row in cursor.fetchall()}


def _not_recalled(ids: list[uuid.UUID], now: datetime) -> dict[uuid.UUID, int]:
    return _per_schedule(_NOT_RECALLED, {
        "ids": ids, "now": now, "limit": RECEIPT_LIMIT,
        "since": now - timedelta(seconds=settings.TICK_RECEIPT_LOOKBACK_S),
        "in_flight": enum_values(IN_FLIGHT), "finished": enum_values(FINISHED),
    })  # fmt: skip


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _event(
    schedule: Schedule, kind: str, actor: str, now: datetime, **detail: Any
) -> ScheduleEvent:
    return ScheduleEvent(
        schedule_id=schedule.id, tenant_id=schedule.tenant_id, kind=kind,
        version=schedule.version, actor=actor, at=now, detail=detail,
    )  # fmt: skip


def _pause(changing: list[Schedule], actor: str, now: datetime) -> list[ScheduleEvent]:
    ids = [s.id for s in changing]
    counts = _not_recalled(ids, now)
    with connection.cursor() as cursor:
        cursor.execute(_PAUSE, {"ids": ids, "now": now, "paused": str(State.PAUSED)})
    return [
        _event(s, ScheduleEvent.Kind.PAUSED, actor, now, invalidated=0,
               not_recalled=counts.get(s.id, 0), next_run_at=_iso(s.next_run_at))
        for s in changing
    ]  # fmt: skip


def _cancel(changing: list[Schedule], actor: str, now: datetime) -> list[ScheduleEvent]:
    ids = [s.id for s in changing]
    counts = _not_recalled(ids, now)
    with connection.cursor() as cursor:
        cursor.execute(_CANCEL, {"ids": ids, "now": now, "canceled": str(State.CANCELED)})
        cursor.execute(_CLOSE_VERSIONS, {"ids": ids, "now": now})
    return [
        _event(s, ScheduleEvent.Kind.CANCELED, actor, now, previous_state=s.state,
               invalidated=0, not_recalled=counts.get(s.id, 0))
        for s in changing
    ]  # fmt: skip


def _resume(changing: list[Schedule], actor: str, now: datetime) -> list[ScheduleEvent]:
    restored = {
        schedule_id: int(n)
        for schedule_id, n in restore_canceled(
            changing, now=now, select="SELECT schedule_id, count(*) FROM back GROUP BY schedule_id"
        )
    }
    with connection.cursor() as cursor:
        cursor.execute(_RESUME, {
            "ids": [s.id for s in changing], "now": now, "completed": str(State.COMPLETED),
            "active": str(State.ACTIVE),
        })  # fmt: skip
    return [
        _event(s, ScheduleEvent.Kind.RESUMED, actor, now, next_run_at=_iso(s.next_run_at),
               misfire_policy=s.misfire_policy, restored=restored.get(s.id, 0))
        for s in changing
    ]  # fmt: skip


_APPLY: dict[str, Callable[[list[Schedule], str, datetime], list[ScheduleEvent]]] = {
    Verb.PAUSE: _pause,
    Verb.RESUME: _resume,
    Verb.CANCEL: _cancel,
}


def _handled_prefix(verb: str, run: Sequence[Schedule], locked: dict[uuid.UUID, Schedule]) -> int:
    """How many of `run` (in order) come before the first one with something to recall."""
    changing = [locked[s.id] for s in run if s.id in locked and locked[s.id].state in CHANGES[verb]]
    stops = recallable(verb, changing)
    for index, schedule in enumerate(run):
        if schedule.id in stops:
            return index
    return len(run)


def apply_run(*, verb: str, run: Sequence[Schedule], actor: str) -> RunOutcome:
    """Change the schedules of `run` (in the caller's transaction) up to the first one with
    something to recall, which the caller hands to the single verb. A schedule gone since
    it was read is counted nowhere."""
    ids = [s.id for s in run]
    locked = {
        s.id: s for s in Schedule.objects.select_for_update().filter(id__in=ids).order_by("id")
    }
    handled = _handled_prefix(verb, run, locked)
    outcome = RunOutcome(handled=handled)
    changing: list[Schedule] = []
    for schedule in run[:handled]:
        current = locked.get(schedule.id)
        if current is None:
            continue
        if current.state in ALREADY[verb]:
            outcome.already += 1
        elif current.state in CHANGES[verb]:
            changing.append(current)
        else:
            outcome.refusals.append(_refusal(verb, current))
    if changing:
        now = timezone.now()
        ScheduleEvent.objects.bulk_create(_APPLY[verb](changing, actor, now))
        outcome.changed = len(changing)
    return outcome
