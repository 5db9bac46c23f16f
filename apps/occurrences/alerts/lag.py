"""Lag rules: "start lag (or enqueue lag) above T seconds for N minutes".

Evaluated by the reaper every `TICK_ALERT_LAG_EVERY_S`. For each enabled lag rule, the
tenant's occurrences (or the rule's schedule's) due in each of the last N whole minutes are
measured from their lag reference (scheduled_for; available_at for flexible and retry lanes,
as the dashboard and `tick_start_lag_seconds`) to the first attempt's start (start lag) or to
the first broker confirm (enqueue lag). One still waiting counts with the lag it has so far, so
a stall is seen before anything starts. The rule fires when every one of the N minutes had
occurrences and a p95 above T. The alert's id names the rule and the N-minute window, so a
lasting condition fires once per window (and the channel's interval still bounds messages).
Only the timetable's occurrences count: a run now or a backfilled instant is not late.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime, timedelta

from django.db import connection

from apps.occurrences.models import LAG_EVENTS, Alert, AlertEvent, AlertRule, Occurrence
from apps.occurrences.selectors import LAG_FROM_AVAILABLE_AT

DEFAULT_THRESHOLD_S = 60
DEFAULT_WINDOW_MINUTES = 5
# States that never start: they have no lag to measure.
_NEVER_RUN = (
    Occurrence.State.CANCELED,
    Occurrence.State.MISSED,
    Occurrence.State.SUPERSEDED,
    Occurrence.State.SKIPPED_OVERLAP,
)

_PER_MINUTE = """
    SELECT date_trunc('minute', o.scheduled_for) AS minute,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM
               COALESCE({measured}, %(now)s)
               - CASE WHEN o.lane = ANY(%(from_available_at)s) THEN o.available_at
                      ELSE o.scheduled_for END))
    FROM occurrences_occurrence o {attempts}
    WHERE o.tenant_id = %(tenant)s AND o.scheduled_for >= %(since)s AND o.scheduled_for < %(until)s
      AND (%(schedule)s::uuid IS NULL OR o.schedule_id = %(schedule)s::uuid)
      AND o.state <> ALL(%(never_run)s) AND o.origin = %(timetable)s
    GROUP BY 1
"""
_ENQUEUE = _PER_MINUTE.format(measured="o.enqueued_at", attempts="")
_START = _PER_MINUTE.format(
    measured="a.started_at",
    attempts="""
    LEFT JOIN occurrences_attempt a
      ON a.occurrence_id = o.id AND a.scheduled_for = o.scheduled_for AND a.attempt_no = 1
     AND a.tenant_id = %(tenant)s AND a.scheduled_for >= %(since)s AND a.scheduled_for < %(until)s
    """,
)


def minute_p95s(rule: AlertRule, *, now: datetime) -> dict[datetime, float]:
    """p95 lag per whole minute of the rule's window (minutes without occurrences absent)."""
    window = rule.window_minutes or DEFAULT_WINDOW_MINUTES
    until = now.replace(second=0, microsecond=0)
    since = until - timedelta(minutes=window)
    sql = _START if rule.event == AlertEvent.START_LAG else _ENQUEUE
    with connection.cursor() as cursor:
        cursor.execute(sql, {
            "now": now, "tenant": rule.tenant_id, "since": since, "until": until,
            "schedule": rule.schedule_id, "never_run": [str(s) for s in _NEVER_RUN],
            "from_available_at": [str(lane) for lane in LAG_FROM_AVAILABLE_AT],
            "timetable": str(Occurrence.Origin.SCHEDULED),
        })  # fmt: skip
        return {minute: float(p95) for minute, p95 in cursor.fetchall()}


def lag_alerts_record(*, now: datetime) -> int:
    """Record an alert for each lag rule whose condition held over its whole window."""
    recorded = 0
    rules = AlertRule.objects.filter(
        enabled=True,
        channel__enabled=True,
        channel__confirmed_at__isnull=False,
        event__in=[str(e) for e in LAG_EVENTS],
    ).select_related("channel")
    for rule in rules:
        window = rule.window_minutes or DEFAULT_WINDOW_MINUTES
        threshold = rule.threshold_s or DEFAULT_THRESHOLD_S
        p95s = minute_p95s(rule, now=now)
        if len(p95s) < window or min(p95s.values()) <= threshold:
            continue
        window_no = int(now.timestamp()) // (window * 60)
        name = "start lag" if rule.event == AlertEvent.START_LAG else "enqueue lag"
        latest = p95s[max(p95s)]
        _, created = Alert.objects.get_or_create(
            id=_lag_alert_id(rule, window_no),
            defaults={
                "tenant_id": rule.tenant_id, "rule": rule, "channel": rule.channel,
                "event": rule.event, "schedule_id": rule.schedule_id,
                "subject": f"{name.upper()}: p95 above {threshold} s for {window} min "
                           f"(last minute {latest:.1f} s)",
                "detail": {"threshold_s": threshold, "window_minutes": window,
                           "p95_by_minute": {m.isoformat(): round(v, 3)
                                             for m, v in sorted(p95s.items())}},
                "fired_at": now,
            },
        )  # fmt: skip
        recorded += int(created)
    return recorded


def _lag_alert_id(rule: AlertRule, window_no: int) -> uuid.UUID:
    digest = hashlib.md5(f"{rule.id}:lag:{window_no}".encode(), usedforsecurity=False)
    return uuid.UUID(digest.hexdigest())
