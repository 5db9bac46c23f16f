"""Loading millions of not-due schedules for `bench_burst --extra-active` (docs/performance.md
"20M active schedules").

Row by row COPY text (bench.fixtures.ScheduleBatch) loads ~6k schedules/s here with every
index maintained: 20M would take an hour. Here Python writes only what must come from
Tick's code (id and `shard_for`) into a temporary table with COPY; PostgreSQL generates the
rest of each row (the same values ScheduleBatch writes) with INSERT … SELECT, while the three
tables' secondary indexes are dropped, then rebuilt with their own definitions
(`pg_get_indexdef`) by sorting. Constraint indexes (primary keys, unique keys) stay. One
transaction: other sessions wait for the tables meanwhile (a scratch database).
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from apps.bench.fixtures import BENCH_HANDLER, copy_into
from apps.schedules.models import Schedule, ScheduleEvent, shard_for

LOADED_TABLES = ("schedules_schedule", "schedules_scheduleversion", "schedules_scheduleevent")
ID_CHUNK = 1_000_000

_SECONDARY_INDEXES = """
    SELECT c.relname, pg_get_indexdef(i.indexrelid)
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    WHERE i.indrelid = %s::regclass
      AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid)
"""

_INSERT_SCHEDULES = """
    INSERT INTO schedules_schedule (id, tenant_id, name, kind, expression, time_zone, dst_gap,
        dst_fold, precision, flexible_window_s, misfire_policy, max_lateness_s, catchup_limit,
        overlap_policy, handler, payload, timeout_s, end_at, version, state, next_run_at, shard,
        created_at, updated_at)
    SELECT id, tenant_id, 'bench', %(kind)s, %(expression)s, 'UTC', %(dst_gap)s, %(dst_fold)s,
           %(precision)s, 0, %(misfire)s, 60, 0, %(overlap)s, %(handler)s, '{}'::jsonb, NULL,
           NULL, 1, %(state)s, %(next_run_at)s, shard, %(now)s, %(now)s
    FROM bench_extra_ids
"""
_INSERT_VERSIONS = """
    INSERT INTO schedules_scheduleversion (schedule_id, tenant_id, version, definition, valid_from)
    SELECT id, tenant_id, 1, %(definition)s::jsonb, %(now)s FROM bench_extra_ids
"""
_INSERT_EVENTS = """
    INSERT INTO schedules_scheduleevent (schedule_id, tenant_id, kind, version, actor, at, detail)
    SELECT id, tenant_id, %(created)s, 1, 'bench', %(now)s, '{}'::jsonb FROM bench_extra_ids
"""


def load_not_due_schedules(
    tenant_ids: list[uuid.UUID],
    weights: list[int],
    count: int,
    *,
    expression: str,
    next_run_at: datetime,
    definition: str,
    say: Callable[[str], object],
) -> None:
    """`count` ACTIVE cron schedules (version 1 and a `created` event each), owners by
    `weights`, all next due at `next_run_at`."""
    owners: list[uuid.UUID] = []
    for tenant_id, weight in zip(tenant_ids, weights, strict=True):
        owners.extend([tenant_id] * weight)
    now = timezone.now()
    # One transaction: a load that fails midway leaves the indexes as they were.
    with transaction.atomic(), connection.cursor() as cursor:
        # Django's foreign keys are deferred: their checks would still be pending when the
        # indexes are rebuilt, which PostgreSQL refuses. Check them per statement instead.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(
            "CREATE TEMPORARY TABLE bench_extra_ids (id uuid, tenant_id uuid, shard smallint) "
            "ON COMMIT DROP"
        )
        for start in range(0, count, ID_CHUNK):
            _copy_ids(cursor, owners, start, min(count, start + ID_CHUNK))
            say(f"  ids: {min(count, start + ID_CHUNK):,}")
        dropped = _drop_secondary_indexes(cursor)
        params: dict[str, Any] = {
            "kind": Schedule.Kind.CRON, "expression": expression,
            "dst_gap": Schedule.DstGap.SKIP, "dst_fold": Schedule.DstFold.FIRST,
            "precision": Schedule.Precision.STRICT, "misfire": Schedule.MisfirePolicy.FIRE_ONCE,
            "overlap": Schedule.OverlapPolicy.ALLOW, "handler": BENCH_HANDLER,
            "state": Schedule.State.ACTIVE, "next_run_at": next_run_at, "now": now,
            "definition": definition, "created": ScheduleEvent.Kind.CREATED,
        }  # fmt: skip
        for statement in (_INSERT_SCHEDULES, _INSERT_VERSIONS, _INSERT_EVENTS):
            cursor.execute(statement, params)
            say(f"  inserted into {statement.split()[2]}")
        cursor.execute("SET maintenance_work_mem = '1GB'")
        for name, definition_sql in dropped:
            cursor.execute(definition_sql)
            say(f"  rebuilt {name}")
    with connection.cursor() as cursor:
        for table in LOADED_TABLES:
            cursor.execute(f"ANALYZE {table}")


def _copy_ids(cursor: CursorWrapper, owners: list[uuid.UUID], start: int, end: int) -> None:
    shards = settings.TICK_SHARDS
    text = io.StringIO()
    for n in range(start, end):
        schedule_id = uuid.uuid4()
        text.write(f"{schedule_id}\t{owners[n % len(owners)]}\t{shard_for(schedule_id, shards)}\n")
    copy_into(cursor, "COPY bench_extra_ids (id, tenant_id, shard) FROM STDIN", text.getvalue())


def _drop_secondary_indexes(cursor: CursorWrapper) -> list[tuple[str, str]]:
    """Drop every index of the loaded tables that backs no constraint; returns (name,
    definition) to rebuild them."""
    dropped: list[tuple[str, str]] = []
    for table in LOADED_TABLES:
        cursor.execute(_SECONDARY_INDEXES, [table])
        for name, definition_sql in cursor.fetchall():
            cursor.execute(f'DROP INDEX "{name}"')
            dropped.append((name, definition_sql))
    return dropped
