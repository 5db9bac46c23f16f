"""Bulk schedule setup shared by the benchmarks: COPY rather than one service call per row.

Every server-owned field is computed with Tick's own code (`shard_for`) and each schedule
gets the version-1 row the create service writes, so the rows are what `schedule_create`
would have produced for a cron schedule with the default policies.
"""

from __future__ import annotations

import io
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db.backends.utils import CursorWrapper

from apps.schedules.models import Schedule, ScheduleEvent, shard_for

SCHEDULE_COPY = (
    "COPY schedules_schedule (id, tenant_id, name, kind, expression, time_zone, dst_gap, "
    "dst_fold, precision, flexible_window_s, misfire_policy, max_lateness_s, catchup_limit, "
    "overlap_policy, handler, payload, version, state, next_run_at, shard, created_at, "
    "updated_at) FROM STDIN"
)
VERSION_COPY = (
    "COPY schedules_scheduleversion (schedule_id, tenant_id, version, definition, valid_from) "
    "FROM STDIN"
)
EVENT_COPY = (
    "COPY schedules_scheduleevent (schedule_id, tenant_id, kind, version, actor, at, detail) "
    "FROM STDIN"
)


def copy_line(*values: object) -> str:
    """One row of COPY text: tab-separated, enums as their stored values."""
    return "\t".join(str(value) for value in values) + "\n"


def copy_into(cursor: CursorWrapper, statement: str, text: str) -> None:
    """COPY `text` with `statement` on Django's cursor (psycopg's: COPY is its own protocol)."""
    if text:
        with cursor.cursor.copy(statement) as copy:
            copy.write(text)


@dataclass
class ScheduleBatch:
    """One chunk of bench cron schedules (all named `bench`, handler `record`), as COPY text."""

    schedules: io.StringIO = field(default_factory=io.StringIO)
    versions: io.StringIO = field(default_factory=io.StringIO)
    events: io.StringIO = field(default_factory=io.StringIO)

    def add_schedule(
        self,
        schedule_id: uuid.UUID,
        tenant_id: uuid.UUID,
        *,
        expression: str,
        time_zone: str,
        precision: Schedule.Precision,
        flexible_window_s: int,
        next_run_at: datetime,
        created_at: datetime,
        definition: str,
    ) -> None:
        """An ACTIVE version-1 schedule (FIRE_ONCE, ALLOW, skip/first) and its version row."""
        self.schedules.write(
            copy_line(
                schedule_id, tenant_id, "bench", Schedule.Kind.CRON, expression, time_zone,
                Schedule.DstGap.SKIP, Schedule.DstFold.FIRST, precision, flexible_window_s,
                Schedule.MisfirePolicy.FIRE_ONCE, 60, 0, Schedule.OverlapPolicy.ALLOW,
                "record", "{}", 1, Schedule.State.ACTIVE, next_run_at.isoformat(),
                shard_for(schedule_id, settings.TICK_SHARDS),
                created_at.isoformat(), created_at.isoformat(),
            )
        )  # fmt: skip
        self.versions.write(
            copy_line(schedule_id, tenant_id, 1, definition, created_at.isoformat())
        )

    def add_created_event(self, schedule_id: uuid.UUID, tenant_id: uuid.UUID, at: datetime) -> None:
        """The `created` event the create service records with version 1."""
        self.events.write(
            copy_line(schedule_id, tenant_id, ScheduleEvent.Kind.CREATED, 1, "bench",
                      at.isoformat(), "{}")
        )  # fmt: skip

    def copy(self, cursor: CursorWrapper) -> None:
        """COPY the buffered rows: schedules, then versions, then events (if any)."""
        copy_into(cursor, SCHEDULE_COPY, self.schedules.getvalue())
        copy_into(cursor, VERSION_COPY, self.versions.getvalue())
        copy_into(cursor, EVENT_COPY, self.events.getvalue())
