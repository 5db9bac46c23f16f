"""Tenant dashboard reads (web UI, docs/ui.md). Every query is tenant-scoped and bounded by a
`scheduled_for` range, so it touches only the day partitions of that range."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count
from django.db.models.functions import TruncMinute

from apps.occurrences.models import Lane, Occurrence
from apps.occurrences.selectors import LAG_FROM_AVAILABLE_AT, occurrences_for
from apps.schedules.models import Schedule
from apps.schedules.selectors import schedules_for
from apps.tenants.models import Tenant

LAG_BUCKET_S = 300
# The lanes whose lag the dashboard charts: the on-time ones.
LAG_LANES = (Lane.STRICT, Lane.FLEXIBLE)

# Lag per 5-minute bucket of scheduled_for and lane, from the lane's lag reference
# (selectors.lag_reference: scheduled_for, or available_at for flexible) to `{measured}`:
# enqueued_at, as the SLO metric `tick_schedule_lag_seconds`, or the first attempt's
# started_at, as `tick_start_lag_seconds` (docs/operations.md "Metrics"). Percentiles are
# computed in PostgreSQL; both tables are read within the range, so within its partitions.
# Runs asked for (run now, backfill) are left out: they are not late (docs/ui.md).
_LAG = """
    SELECT to_timestamp(floor(extract(epoch FROM o.scheduled_for) / %(bucket)s) * %(bucket)s)
               AS bucket,
           o.lane,
           count(*),
           percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM
               {measured} - CASE WHEN o.lane = ANY(%(from_available_at)s) THEN o.available_at
                                 ELSE o.scheduled_for END))
    FROM occurrences_occurrence o {attempts}
    WHERE o.tenant_id = %(tenant)s AND o.scheduled_for >= %(since)s AND o.scheduled_for < %(until)s
      AND {measured} IS NOT NULL AND o.lane = ANY(%(lanes)s) AND o.origin = %(timetable)s
    GROUP BY 1, 2
    ORDER BY 1, 2
"""
_ENQUEUE_LAG = _LAG.format(measured="o.enqueued_at", attempts="")
# Attempt 1 by its unique key; its own range bound prunes the attempt partitions at planning
# (the join's equality alone would not carry the range over).
_START_LAG = _LAG.format(
    measured="a.started_at",
    attempts="""
    JOIN occurrences_attempt a
      ON a.occurrence_id = o.id AND a.scheduled_for = o.scheduled_for AND a.attempt_no = 1
     AND a.tenant_id = %(tenant)s AND a.scheduled_for >= %(since)s AND a.scheduled_for < %(until)s
    """,
)


@dataclass(frozen=True)
class LagPoint:
    bucket: datetime
    lane: str
    count: int
    p50: float
    p95: float
    p99: float


def _percentiles(sql: str, *, tenant: Tenant, now: datetime, hours: int) -> list[LagPoint]:
    with connection.cursor() as cursor:
        cursor.execute(sql, {
            "bucket": LAG_BUCKET_S, "tenant": tenant.id, "since": now - timedelta(hours=hours),
            "until": now, "lanes": [str(lane) for lane in LAG_LANES],
            "from_available_at": [str(lane) for lane in LAG_FROM_AVAILABLE_AT],
            "timetable": str(Occurrence.Origin.SCHEDULED),
        })  # fmt: skip
        rows = cursor.fetchall()
    return [
        LagPoint(row[0], row[1], int(row[2]), *(round(float(v), 3) for v in row[3])) for row in rows
    ]


def lag_percentiles(*, tenant: Tenant, now: datetime, hours: int = 6) -> list[LagPoint]:
    """Enqueue lag: from the lane's reference to the first broker confirm."""
    return _percentiles(_ENQUEUE_LAG, tenant=tenant, now=now, hours=hours)


def start_lag_percentiles(*, tenant: Tenant, now: datetime, hours: int = 6) -> list[LagPoint]:
    """Start lag: from the lane's reference to the start of the first attempt."""
    return _percentiles(_START_LAG, tenant=tenant, now=now, hours=hours)


def lag_chart_data(points: list[LagPoint]) -> dict[str, Any]:
    """Chart.js-ready series: one label per bucket, p50/p95/p99 per lane (None = no data)."""
    labels = sorted({p.bucket for p in points})
    index = {(p.bucket, p.lane): p for p in points}
    series: dict[str, Any] = {}
    for lane in LAG_LANES:
        for q in ("p50", "p95", "p99"):
            series[f"{lane}_{q}"] = [
                getattr(index[(b, lane)], q) if (b, lane) in index else None for b in labels
            ]
    return {"labels": [b.strftime("%H:%M") for b in labels], "series": series}


def schedules_by_state(*, tenant: Tenant) -> dict[str, int]:
    rows = schedules_for(tenant=tenant).values("state").annotate(n=Count("id")).order_by()
    return {row["state"]: row["n"] for row in rows}


def occurrences_by_state(*, tenant: Tenant, since: datetime, until: datetime) -> dict[str, int]:
    rows = (
        occurrences_for(tenant=tenant)
        .filter(scheduled_for__gte=since, scheduled_for__lt=until)
        .values("state")
        .annotate(n=Count("id"))
        .order_by()
    )
    return {row["state"]: row["n"] for row in rows}


def due_backlog(*, tenant: Tenant, now: datetime, minutes: int = 10) -> list[dict[str, Any]]:
    """The minutes from 5 min ago to `minutes` ahead that hold work not yet handed to the
    queue: occurrences still SCHEDULED and active schedules whose instant is not yet
    materialized. Only minutes with such work are listed, each labelled: "overdue" before the
    current minute (with the schedules overdue from before the window in its first row),
    "due now", or "due in N min" (docs/ui.md "Dashboard")."""
    current = now.replace(second=0, microsecond=0)
    start = current - timedelta(minutes=5)
    end = current + timedelta(minutes=minutes + 1)
    pending = {
        row["minute"]: row["n"]
        for row in occurrences_for(tenant=tenant)
        .filter(scheduled_for__gte=start, scheduled_for__lt=end,
                state=Occurrence.State.SCHEDULED)
        .annotate(minute=TruncMinute("scheduled_for"))
        .values("minute")
        .annotate(n=Count("id"))
        .order_by()
    }  # fmt: skip
    due = schedules_for(tenant=tenant).filter(state=Schedule.State.ACTIVE)
    unmaterialized = {
        row["minute"]: row["n"]
        for row in due.filter(next_run_at__gte=start, next_run_at__lt=end)
        .annotate(minute=TruncMinute("next_run_at"))
        .values("minute")
        .annotate(n=Count("id"))
        .order_by()
    }
    # Schedules whose next instant is older than the window: overdue, shown in its first row.
    overdue = due.filter(next_run_at__lt=start).count()
    unmaterialized[start] = unmaterialized.get(start, 0) + overdue
    rows = []
    minute = start
    while minute < end:
        waiting, planned = pending.get(minute, 0), unmaterialized.get(minute, 0)
        if waiting or planned:
            ahead = int((minute - current).total_seconds() // 60)
            label = "overdue" if ahead < 0 else "due now" if ahead == 0 else f"due in {ahead} min"
            rows.append({
                "minute": minute, "past": ahead < 0, "label": label,
                "pending": waiting, "unmaterialized": planned,
            })  # fmt: skip
        minute += timedelta(minutes=1)
    return rows


def next_due(*, tenant: Tenant, now: datetime) -> datetime | None:
    """The earliest run still to come of the tenant's active schedules: a pending occurrence
    of the next day, or else the earliest instant not yet materialized."""
    pending = (
        occurrences_for(tenant=tenant)
        .filter(scheduled_for__gte=now, scheduled_for__lt=now + timedelta(days=1),
                state__in=(Occurrence.State.SCHEDULED, Occurrence.State.ENQUEUED))
        .order_by("scheduled_for")
        .values_list("scheduled_for", flat=True)
        .first()
    )  # fmt: skip
    planned = (
        schedules_for(tenant=tenant)
        .filter(state=Schedule.State.ACTIVE, next_run_at__isnull=False)
        .order_by("next_run_at")
        .values_list("next_run_at", flat=True)
        .first()
    )
    return min((t for t in (pending, planned) if t is not None), default=None)


def dlq_count(*, tenant: Tenant, now: datetime) -> int:
    """DEAD occurrences within retention (older partitions are dropped anyway)."""
    since = now - timedelta(days=settings.TICK_RETENTION_DAYS)
    return (
        occurrences_for(tenant=tenant)
        .filter(state=Occurrence.State.DEAD, scheduled_for__gte=since)
        .count()
    )


def quota_usage(*, tenant: Tenant, now: datetime) -> list[dict[str, Any]]:
    active = (
        schedules_for(tenant=tenant)
        .filter(state__in=[Schedule.State.ACTIVE, Schedule.State.PAUSED])
        .count()
    )
    running = (
        occurrences_for(tenant=tenant)
        .filter(state=Occurrence.State.RUNNING,
                scheduled_for__gte=now - timedelta(seconds=settings.TICK_OVERLAP_LOOKBACK_S))
        .count()
    )  # fmt: skip
    rows = [
        ("Active + paused schedules", active, tenant.max_active_schedules),
        ("Running occurrences", running, tenant.max_running),
    ]
    usage = [
        {"name": name, "used": used, "limit": limit,
         "percent": min(100, round(100 * used / limit)) if limit else 100}
        for name, used, limit in rows
    ]  # fmt: skip
    return usage + [
        {"name": "Trigger rate (per s)", "used": None, "limit": tenant.trigger_rate_per_s},
        {"name": "Catch-up rate (per s)", "used": None, "limit": tenant.catchup_rate_per_s},
        {"name": "Retries per hour", "used": None, "limit": tenant.retry_budget_per_hour},
        {"name": "Min interval between fires (s)", "used": None, "limit": tenant.min_interval_s},
    ]
