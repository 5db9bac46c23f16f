"""How each schedule is doing, at a glance (docs/ui.md "Health"): its last run, its last
success, the success rate of its latest finished occurrences, and whether it is late or
failing. Read for a page of schedules in one set-based query (a LATERAL probe per schedule on
`occurrence_schedule_time_idx`, bounded to the day partitions of HEALTH_WINDOW), never per row.

The "failing" and "late" filters cannot be answered by an index (they are facts about each
schedule's recent occurrences), so `schedules_health_scan` walks the schedule list in its own
keyset order, a batch at a time, and stops after SCAN_BUDGET schedules even if the page is not
full: a request costs at most SCAN_BUDGET / SCAN_BATCH health queries whatever the tenant's
size, and the page offers to search on from where it stopped."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from django.db import connection
from django.db.models import Q, QuerySet

from apps.occurrences.models import Attempt, Occurrence
from apps.occurrences.selectors import LAG_FROM_AVAILABLE_AT
from apps.schedules.models import Schedule

# Occurrences older than this do not count: the health reads this many day partitions at most.
HEALTH_WINDOW = timedelta(days=7)
# The success rate is over a schedule's latest finished occurrences, at most this many.
RATE_OVER = 20
# Finished: the instant's outcome is known. MISSED counts as not successful (the run a tenant
# expected did not happen); CANCELED, SUPERSEDED and SKIPPED_OVERLAP were the tenant's choice.
FINISHED_STATES: tuple[Occurrence.State, ...] = (
    Occurrence.State.SUCCEEDED,
    Occurrence.State.DEAD,
    Occurrence.State.MISSED,
)
# The last run: the latest occurrence that began (or should have) — finished, running or
# waiting to retry.
RUN_STATES: tuple[Occurrence.State, ...] = (
    *FINISHED_STATES,
    Occurrence.State.RUNNING,
    Occurrence.State.RETRY_WAIT,
)
# Failing: the last finished occurrence did not succeed, or fewer than this share of the
# latest RATE_OVER finished ones did.
FAILING_BELOW = 0.8
# Late: an occurrence due within LATE_WINDOW (at most LATE_LOOKBACK of the latest) is still
# SCHEDULED or ENQUEUED more than LATE_AFTER past its lag reference, or its first attempt
# started more than LATE_AFTER after it (the start lag of docs/ui.md). Only the timetable's own
# occurrences count: a backfilled instant is past by design and a run now was never due
# before it was asked for (docs/ui.md "Asked-for runs are never late").
LATE_AFTER = timedelta(seconds=60)
LATE_WINDOW = timedelta(hours=1)
LATE_LOOKBACK = 10
NOT_STARTED_STATES: tuple[Occurrence.State, ...] = (
    Occurrence.State.SCHEDULED,
    Occurrence.State.ENQUEUED,
)
# The filters' scan: schedules read per health query, and at most per request.
SCAN_BATCH = 100
SCAN_BUDGET = 500


class HealthFilter(StrEnum):
    FAILING = "failing"
    LATE = "late"


@dataclass(frozen=True)
class ScheduleHealth:
    last_run_state: Occurrence.State | None = None
    last_run_at: datetime | None = None  # finished_at, or the instant while it is unfinished
    last_success_at: datetime | None = None  # finished_at of the latest SUCCEEDED
    finished: int = 0  # of the latest RATE_OVER finished occurrences in the window
    succeeded: int = 0
    last_finished_state: Occurrence.State | None = None
    late: bool = False

    @property
    def success_rate(self) -> float | None:
        """Share of the latest finished occurrences that succeeded; None without any."""
        return self.succeeded / self.finished if self.finished else None

    @property
    def failing(self) -> bool:
        if self.last_finished_state is None:
            return False
        rate = self.success_rate
        return self.last_finished_state != Occurrence.State.SUCCEEDED or (
            rate is not None and rate < FAILING_BELOW
        )

    def matches(self, want: HealthFilter) -> bool:
        return self.failing if want == HealthFilter.FAILING else self.late


_OCC = Occurrence._meta.db_table
_ATT = Attempt._meta.db_table

# Each LATERAL reads one schedule's newest rows backwards on (schedule_id, scheduled_for);
# the `scheduled_for >= since` bound prunes the day partitions at plan time.
_HEALTH_SQL = f"""
SELECT s.id, run.state, run.at, ok.at, fin.n, fin.ok, fin.last_state, late.n
FROM unnest(%(ids)s::uuid[]) AS s(id)
LEFT JOIN LATERAL (
    SELECT o.state, COALESCE(o.finished_at, o.scheduled_for) AS at FROM {_OCC} o
    WHERE o.schedule_id = s.id AND o.tenant_id = %(tenant)s AND o.state = ANY(%(run)s)
      AND o.scheduled_for >= %(since)s AND o.scheduled_for <= %(now)s
    ORDER BY o.scheduled_for DESC LIMIT 1
) run ON true
LEFT JOIN LATERAL (
    SELECT COALESCE(o.finished_at, o.scheduled_for) AS at FROM {_OCC} o
    WHERE o.schedule_id = s.id AND o.tenant_id = %(tenant)s AND o.state = %(succeeded)s
      AND o.scheduled_for >= %(since)s AND o.scheduled_for <= %(now)s
    ORDER BY o.scheduled_for DESC LIMIT 1
) ok ON true
LEFT JOIN LATERAL (
    SELECT count(*) AS n, count(*) FILTER (WHERE f.state = %(succeeded)s) AS ok,
           (array_agg(f.state ORDER BY f.scheduled_for DESC))[1] AS last_state
    FROM (
        SELECT o.state, o.scheduled_for FROM {_OCC} o
        WHERE o.schedule_id = s.id AND o.tenant_id = %(tenant)s AND o.state = ANY(%(finished)s)
          AND o.scheduled_for >= %(since)s AND o.scheduled_for <= %(now)s
        ORDER BY o.scheduled_for DESC LIMIT %(rate_over)s
    ) f
) fin ON true
LEFT JOIN LATERAL (
    SELECT count(*) AS n FROM (
        SELECT o.id, o.scheduled_for, o.state,
               CASE WHEN o.lane = ANY(%(from_available)s) THEN o.available_at
                    ELSE o.scheduled_for END AS due
        FROM {_OCC} o
        WHERE o.schedule_id = s.id AND o.tenant_id = %(tenant)s AND o.origin = %(timetable)s
          AND o.scheduled_for >= %(late_since)s AND o.scheduled_for <= %(now)s
        ORDER BY o.scheduled_for DESC LIMIT %(late_lookback)s
    ) r
    LEFT JOIN {_ATT} a
      ON a.occurrence_id = r.id AND a.scheduled_for = r.scheduled_for AND a.attempt_no = 1
    WHERE (r.state = ANY(%(not_started)s) AND r.due < %(late_before)s)
       OR a.started_at - r.due > %(late_after)s
) late ON true
"""


def schedules_health(
    schedules: Iterable[Schedule], *, now: datetime
) -> dict[uuid.UUID, ScheduleHealth]:
    """The health of each schedule (all of one tenant), in one query."""
    rows = list(schedules)
    if not rows:
        return {}
    tenants = {s.tenant_id for s in rows}
    if len(tenants) != 1:
        raise ValueError("schedules_health reads one tenant's schedules at a time")
    params: dict[str, Any] = {
        "ids": [s.id for s in rows], "tenant": tenants.pop(), "now": now,
        "since": now - HEALTH_WINDOW, "run": list(RUN_STATES), "finished": list(FINISHED_STATES),
        "succeeded": Occurrence.State.SUCCEEDED.value, "rate_over": RATE_OVER,
        "from_available": list(LAG_FROM_AVAILABLE_AT), "late_since": now - LATE_WINDOW,
        "late_lookback": LATE_LOOKBACK, "not_started": list(NOT_STARTED_STATES),
        "late_before": now - LATE_AFTER, "late_after": LATE_AFTER,
        "timetable": Occurrence.Origin.SCHEDULED.value,
    }  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(_HEALTH_SQL, params)
        found = cursor.fetchall()
    health: dict[uuid.UUID, ScheduleHealth] = {}
    for sid, run_state, run_at, ok_at, n, ok, last_state, late in found:
        health[sid] = ScheduleHealth(
            last_run_state=Occurrence.State(run_state) if run_state else None,
            last_run_at=run_at,
            last_success_at=ok_at,
            finished=n or 0,
            succeeded=ok or 0,
            last_finished_state=Occurrence.State(last_state) if last_state else None,
            late=bool(late),
        )
    return health


Position = tuple[datetime, uuid.UUID]


@dataclass(frozen=True)
class HealthScan:
    rows: list[tuple[Schedule, ScheduleHealth]]
    resume_after: Position | None  # where the next request searches on; None at the end
    scanned: int  # schedules examined by this request


def schedules_health_scan(
    queryset: QuerySet[Schedule],
    *,
    want: HealthFilter,
    after: Position | None,
    size: int,
    now: datetime,
    budget: int = SCAN_BUDGET,
    batch: int = SCAN_BATCH,
) -> HealthScan:
    """Up to `size` schedules of `queryset` (newest first on (created_at, id), after
    `after`) whose health matches `want`, examining at most `budget` schedules."""
    ordered = queryset.order_by("-created_at", "-id")
    found: list[tuple[Schedule, ScheduleHealth]] = []
    scanned = 0
    position = after
    while scanned < budget:
        page = ordered
        if position is not None:
            at, row_id = position
            page = page.filter(Q(created_at__lt=at) | Q(created_at=at, id__lt=row_id))
        schedules = list(page[: min(batch, budget - scanned)])
        if not schedules:
            return HealthScan(found, None, scanned)
        health = schedules_health(schedules, now=now)
        for schedule in schedules:
            scanned += 1
            position = (schedule.created_at, schedule.id)
            if health[schedule.id].matches(want):
                found.append((schedule, health[schedule.id]))
                if len(found) == size:
                    return HealthScan(found, _more(ordered, position), scanned)
    return HealthScan(found, _more(ordered, position), scanned)


def _more(ordered: QuerySet[Schedule], position: Position | None) -> Position | None:
    """`position` if any schedule follows it, else None (the list ends there)."""
    if position is None:
        return None
    at, row_id = position
    follows = ordered.filter(Q(created_at__lt=at) | Q(created_at=at, id__lt=row_id))
    return position if follows.exists() else None
