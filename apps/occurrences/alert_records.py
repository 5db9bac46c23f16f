"""Recording alerts in the transaction that changes the state they report.

An alert row is written by the same statement (or transaction) that sends an occurrence DEAD
or records a schedule's MISSED/COMPLETED event, so a committed change always has its alerts
and a rolled-back one has none. Ids are deterministic (rule + subject): recording the same
event again stores nothing new. Only enabled rules of enabled, confirmed channels record (an
e-mail channel is confirmed by its address: alerts/confirm.py). With no matching rule the
join is empty and costs one index probe on the rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final
from uuid import UUID

from django.db.backends.utils import CursorWrapper

from apps.occurrences.models import AlertEvent
from apps.schedules.models import ScheduleEvent

_TIME_TEXT: Final = "to_char({col} AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC'"

# Parameters every statement that embeds `dead_alerts_cte` must pass.
DEAD_ALERT_PARAMS: Final[dict[str, str]] = {"alert_dead_event": AlertEvent.OCCURRENCE_DEAD}


def dead_alerts_cte(name: str, source: str) -> str:
    """A data-modifying CTE that records an OCCURRENCE_DEAD alert per matching rule for the
    occurrences of `source` (a CTE or subquery with id, scheduled_for, schedule_id and
    tenant_id). PostgreSQL runs it even when nothing reads it."""
    when = _TIME_TEXT.format(col="src.scheduled_for")
    return f"""
    {name} AS (
        INSERT INTO occurrences_alert (id, tenant_id, rule_id, channel_id, event, schedule_id,
                                       occurrence_id, subject, detail, fired_at, delivery_id)
        SELECT md5(r.id::text || ':' || src.id::text)::uuid, src.tenant_id, r.id, r.channel_id,
               %(alert_dead_event)s, src.schedule_id, src.id,
               left('DEAD: ' || s.name || ' (run of ' || {when} || ')', 300),
               jsonb_build_object('scheduled_for', src.scheduled_for, 'schedule', s.name),
               now(), NULL
        FROM {source} src
        JOIN occurrences_alertrule r
          ON r.tenant_id = src.tenant_id AND r.event = %(alert_dead_event)s AND r.enabled
         AND (r.schedule_id IS NULL OR r.schedule_id = src.schedule_id)
        JOIN occurrences_alertchannel c
          ON c.id = r.channel_id AND c.enabled AND c.confirmed_at IS NOT NULL
        JOIN schedules_schedule s ON s.id = src.schedule_id
        ON CONFLICT (id) DO NOTHING
        RETURNING 1
    )"""


_ONE_DEAD = (
    """
    WITH src AS (
        SELECT %(id)s::uuid AS id, %(scheduled_for)s::timestamptz AS scheduled_for,
               %(schedule_id)s::uuid AS schedule_id, %(tenant_id)s::uuid AS tenant_id
    ),"""
    + dead_alerts_cte("recorded", "src")
    + """
    SELECT count(*) FROM recorded
"""
)


def record_dead_alert(
    cursor: CursorWrapper,
    *,
    occurrence_id: UUID,
    scheduled_for: datetime,
    schedule_id: UUID,
    tenant_id: UUID,
) -> int:
    """Alerts for one occurrence that just went DEAD (in the caller's transaction)."""
    cursor.execute(_ONE_DEAD, {
        "id": occurrence_id, "scheduled_for": scheduled_for, "schedule_id": schedule_id,
        "tenant_id": tenant_id, **DEAD_ALERT_PARAMS,
    })  # fmt: skip
    row = cursor.fetchone()
    return int(row[0]) if row else 0


_SCHEDULE_EVENTS = """
    INSERT INTO occurrences_alert (id, tenant_id, rule_id, channel_id, event, schedule_id,
                                   occurrence_id, subject, detail, fired_at, delivery_id)
    SELECT md5(r.id::text || ':event:' || e.id::text)::uuid, e.tenant_id, r.id, r.channel_id,
           r.event, e.schedule_id, NULL,
           left(CASE WHEN e.kind = %(missed_kind)s
                     THEN 'MISSED: ' || s.name || ' missed '
                          || COALESCE(e.detail ->> 'missed_count', '?') || ' run(s)'
                     ELSE 'COMPLETED: ' || s.name || ' has no run left' END, 300),
           jsonb_build_object('schedule', s.name, 'schedule_event_id', e.id,
                              'missed_count', e.detail -> 'missed_count',
                              'policy', e.detail -> 'policy'),
           e.at, NULL
    FROM schedules_scheduleevent e
    JOIN occurrences_alertrule r
      ON r.tenant_id = e.tenant_id AND r.enabled
     AND r.event = CASE WHEN e.kind = %(missed_kind)s THEN %(missed_event)s
                        ELSE %(completed_event)s END
     AND (r.schedule_id IS NULL OR r.schedule_id = e.schedule_id)
    JOIN occurrences_alertchannel c
      ON c.id = r.channel_id AND c.enabled AND c.confirmed_at IS NOT NULL
    JOIN schedules_schedule s ON s.id = e.schedule_id
    WHERE e.id = ANY(%(ids)s) AND e.kind IN (%(missed_kind)s, %(completed_kind)s)
    ON CONFLICT (id) DO NOTHING
"""

ALERTED_SCHEDULE_EVENTS: Final = (ScheduleEvent.Kind.MISSED, ScheduleEvent.Kind.COMPLETED)


def record_schedule_event_alerts(cursor: CursorWrapper, events: Sequence[ScheduleEvent]) -> int:
    """Alerts for the MISSED and COMPLETED schedule events just written (saved rows)."""
    ids = [e.pk for e in events if e.kind in ALERTED_SCHEDULE_EVENTS and e.pk is not None]
    return record_schedule_event_alerts_by_id(cursor, ids)


def record_schedule_event_alerts_by_id(cursor: CursorWrapper, ids: Sequence[int]) -> int:
    """Alerts for the saved schedule events `ids` that are MISSED or COMPLETED."""
    if not ids:
        return 0
    params: dict[str, Any] = {
        "ids": list(ids),
        "missed_kind": ScheduleEvent.Kind.MISSED,
        "completed_kind": ScheduleEvent.Kind.COMPLETED,
        "missed_event": AlertEvent.OCCURRENCE_MISSED,
        "completed_event": AlertEvent.SCHEDULE_COMPLETED,
    }
    cursor.execute(_SCHEDULE_EVENTS, params)
    return int(cursor.rowcount)


_FAILURE_PAUSE = """
    INSERT INTO occurrences_alert (id, tenant_id, rule_id, channel_id, event, schedule_id,
                                   occurrence_id, subject, detail, fired_at, delivery_id)
    SELECT md5(r.id::text || ':event:' || e.id::text)::uuid, e.tenant_id, r.id, r.channel_id,
           r.event, e.schedule_id, NULL,
           left('PAUSED: ' || s.name || ' after ' || COALESCE(e.detail ->> 'reason', ''), 300),
           jsonb_build_object('schedule', s.name, 'schedule_event_id', e.id,
                              'reason', e.detail -> 'reason'),
           e.at, NULL
    FROM schedules_scheduleevent e
    JOIN occurrences_alertrule r
      ON r.tenant_id = e.tenant_id AND r.enabled AND r.event = %(event)s
     AND (r.schedule_id IS NULL OR r.schedule_id = e.schedule_id)
    JOIN occurrences_alertchannel c
      ON c.id = r.channel_id AND c.enabled AND c.confirmed_at IS NOT NULL
    JOIN schedules_schedule s ON s.id = e.schedule_id
    WHERE e.id = ANY(%(ids)s)
    ON CONFLICT (id) DO NOTHING
"""


def record_failure_pause_alerts(cursor: CursorWrapper, events: Sequence[ScheduleEvent]) -> int:
    """Alerts for `paused` events Tick wrote after consecutive DEAD occurrences
    (apps/occurrences/failure_pause.py), one per matching rule, grouped by the reaper like
    every alert."""
    ids = [e.pk for e in events if e.pk is not None]
    if not ids:
        return 0
    cursor.execute(_FAILURE_PAUSE, {"ids": ids, "event": AlertEvent.SCHEDULE_PAUSED_FAILING})
    return int(cursor.rowcount)
