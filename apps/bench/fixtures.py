"""Bulk setup shared by the benchmarks: COPY rather than one service call per row.

Every server-owned field is computed with Tick's own code (`shard_for`) and each schedule
gets the version-1 row the create service writes, so the rows are what `schedule_create`
would have produced for a cron schedule with the default policies. Also here: the bench
tenants (rate quotas lifted) and the removal of every row a benchmark left behind.
"""

from __future__ import annotations

import io
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.backends.utils import CursorWrapper

from apps.schedules.models import Schedule, ScheduleEvent, shard_for
from apps.tenants.models import Tenant
from apps.tenants.services import tenant_create

SCHEDULE_COPY = (
    "COPY schedules_schedule (id, tenant_id, name, kind, expression, time_zone, dst_gap, "
    "dst_fold, precision, flexible_window_s, misfire_policy, max_lateness_s, catchup_limit, "
    "overlap_policy, handler, payload, timeout_s, end_at, version, state, next_run_at, shard, "
    "created_at, updated_at) FROM STDIN"
)
# COPY text's NULL.
COPY_NULL = "\\N"
# Every table holding a bench tenant's rows, children first; `tenant_id` keys them all.
TENANT_TABLES = (
    "occurrences_dispatchoutbox",
    "occurrences_attempt",
    "occurrences_handlereffect",
    "occurrences_retrybudget",
    "occurrences_occurrence",
    "schedules_scheduleevent",
    "schedules_scheduleversion",
    "schedules_schedule",
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
    """One row of COPY text: tab-separated, enums as their stored values, None as NULL."""
    return "\t".join(COPY_NULL if value is None else str(value) for value in values) + "\n"


def copy_into(cursor: CursorWrapper, statement: str, text: str) -> None:
    """COPY `text` with `statement` on Django's cursor (psycopg's: COPY is its own protocol)."""
    if text:
        with cursor.cursor.copy(statement) as copy:
            copy.write(text)


# The demo/test handler every bench schedule names: it records its run and obeys the
# payload's `sleep_s` (execution/demo_handlers.py).
BENCH_HANDLER = "record"


def cron_definition(
    expression: str, *, precision: Schedule.Precision, window_s: int, **extra: Any
) -> str:
    """The version-1 `definition` of a bench cron schedule in UTC, as JSON text; `extra`
    adds fields the schedule sets beyond the defaults (payload, end_at, timeout_s)."""
    return json.dumps(
        {"kind": Schedule.Kind.CRON, "expression": expression, "time_zone": "UTC",
         "precision": precision, "flexible_window_s": window_s, "handler": BENCH_HANDLER,
         **extra}
    )  # fmt: skip


def bench_tenants(prefix: str, count: int) -> list[uuid.UUID]:
    """`count` fresh tenants named after the run's prefix, with the rate quotas lifted: a
    benchmark measures Tick's capacity, not a tenant's quota."""
    tenant_ids = [tenant_create(slug=f"bench-{prefix[-8:]}-{i}").id for i in range(count)]
    Tenant.objects.filter(id__in=tenant_ids).update(
        trigger_rate_per_s=10_000_000, catchup_rate_per_s=10_000_000
    )
    return tenant_ids


def bench_tenants_delete(tenant_ids: list[uuid.UUID]) -> None:
    """Every row of the bench tenants, then the tenants."""
    with connection.cursor() as cursor:
        for table in TENANT_TABLES:
            cursor.execute(f"DELETE FROM {table} WHERE tenant_id = ANY(%s)", [tenant_ids])
        cursor.execute("DELETE FROM tenants_tenant WHERE id = ANY(%s)", [tenant_ids])


def next_whole_minute(now: datetime, lead_s: float) -> datetime:
    """The first whole minute at least `lead_s` after `now`: a cron rule can name it."""
    instant = (now + timedelta(seconds=lead_s)).replace(second=0, microsecond=0)
    if instant < now + timedelta(seconds=lead_s):
        instant += timedelta(minutes=1)
    return instant


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
        payload: str = "{}",
        timeout_s: int | None = None,
        end_at: datetime | None = None,
        handler: str = BENCH_HANDLER,
    ) -> None:
        """An ACTIVE version-1 schedule (FIRE_ONCE, ALLOW, skip/first) and its version row.
        `payload` is JSON text; `timeout_s` and `end_at` None keep the defaults."""
        self.schedules.write(
            copy_line(
                schedule_id, tenant_id, "bench", Schedule.Kind.CRON, expression, time_zone,
                Schedule.DstGap.SKIP, Schedule.DstFold.FIRST, precision, flexible_window_s,
                Schedule.MisfirePolicy.FIRE_ONCE, 60, 0, Schedule.OverlapPolicy.ALLOW,
                handler, payload, timeout_s, end_at.isoformat() if end_at else None, 1,
                Schedule.State.ACTIVE, next_run_at.isoformat(),
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
