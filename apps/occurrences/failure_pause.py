"""Pause after N consecutive DEAD occurrences (docs/alerts.md "Paused after failures").

The completion counts the streak (execution/complete.py, after its commit: no schedule lock
under the attempt and occurrence locks); the reaper calls `failing_schedules_pause` each pass,
which finds the schedules whose streak reached their setting through a partial index that
holds only those, and pauses each with the single verb (`schedule_pause`, actor `tick`, the
reason in its `paused` event) and records a `schedule_paused_failing` alert for the tenant's
rules in the same transaction. Resume sets the streak back to 0 (services.mark_active).
"""

from __future__ import annotations

import logging

from django.db import connection, transaction
from django.db.models import F

from apps.occurrences.alert_records import record_failure_pause_alerts
from apps.occurrences.schedule_changes import schedule_pause
from apps.schedules.errors import LifecycleError
from apps.schedules.models import Schedule, ScheduleEvent

log = logging.getLogger("tick.failure_pause")

ACTOR = "tick"
# Schedules paused per reaper pass at most; the rest the next pass.
PASS_LIMIT = 100


def failing_schedules_pause() -> int:
    """Pause every ACTIVE schedule whose consecutive DEAD occurrences reached its setting;
    returns how many were paused."""
    due = Schedule.objects.filter(
        state=Schedule.State.ACTIVE, pause_after_dead__gt=0,
        dead_streak__gte=F("pause_after_dead"),
    ).order_by("id")[:PASS_LIMIT]  # fmt: skip
    paused = 0
    for schedule in due:
        reason = (
            f"{schedule.dead_streak} consecutive DEAD occurrences "
            f"(pause after {schedule.pause_after_dead})"
        )
        try:
            with transaction.atomic():
                result = schedule_pause(schedule=schedule, actor=ACTOR, reason=reason)
                event = (
                    ScheduleEvent.objects.filter(
                        schedule=result.schedule, kind=ScheduleEvent.Kind.PAUSED
                    )
                    .order_by("-id")
                    .first()
                )
                if event is not None and event.actor == ACTOR:
                    with connection.cursor() as cursor:
                        record_failure_pause_alerts(cursor, [event])
        except LifecycleError as err:  # changed meanwhile (canceled): nothing to pause
            log.info("schedule %s not paused: %s", schedule.id, err.message)
            continue
        log.info("schedule %s paused: %s", schedule.id, reason)
        paused += 1
    return paused
