"""What a benchmark's data costs the database: sizes per table and index, and the due scan's
plan (docs/performance.md "20M active schedules")."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.occurrences.pipeline.materializer import DISTANT_PAST, SELECT_DUE

MIB = 1024 * 1024
# The tables that grow with schedules and occurrences; partitioned ones are summed over their
# partitions.
GROWING_TABLES = (
    "schedules_schedule",
    "schedules_scheduleversion",
    "schedules_scheduleevent",
    "occurrences_occurrence",
    "occurrences_attempt",
    "occurrences_dispatchoutbox",
)

# A partitioned table's leaves, or the table itself (pg_partition_tree is empty for a plain
# table on PostgreSQL 15).
_TABLE_SIZES = """
    WITH leaves AS (
        SELECT relid FROM pg_partition_tree(%(table)s::regclass) WHERE isleaf
        UNION ALL
        SELECT %(table)s::regclass
        WHERE NOT EXISTS (SELECT 1 FROM pg_partition_tree(%(table)s::regclass))
    )
    SELECT coalesce(sum(pg_table_size(l.relid)), 0)::float8,
           coalesce(sum(pg_indexes_size(l.relid)), 0)::float8,
           coalesce(sum(greatest(c.reltuples, 0)), 0)::float8
    FROM leaves l JOIN pg_class c ON c.oid = l.relid
"""
_INDEX_SIZES = """
    SELECT i.indexrelid::regclass::text, pg_relation_size(i.indexrelid)
    FROM pg_index i WHERE i.indrelid = %s::regclass ORDER BY 2 DESC
"""


def relation_sizes() -> dict[str, dict[str, float]]:
    """MiB of heap and of indexes and the estimated rows of each growing table (ANALYZE
    them first for fresh row estimates)."""
    sizes: dict[str, dict[str, float]] = {}
    with connection.cursor() as cursor:
        for table in GROWING_TABLES:
            cursor.execute(_TABLE_SIZES, {"table": table})
            row = cursor.fetchone()
            assert row is not None
            heap, indexes, rows = row
            sizes[table] = {
                "table_mib": round(heap / MIB, 1),
                "indexes_mib": round(indexes / MIB, 1),
                "rows": float(rows),
            }
    return sizes


def index_sizes(table: str) -> dict[str, float]:
    """MiB of each index of `table` (not partitioned), largest first."""
    with connection.cursor() as cursor:
        cursor.execute(_INDEX_SIZES, [table])
        return {name: round(size / MIB, 1) for name, size in cursor.fetchall()}


def due_scan_plan(*, window_s: int | None = None, limit: int | None = None) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of the materializer's due scan over every shard, as one
    batch runs it at this moment; rolled back, so it locks nothing afterwards."""
    now = timezone.now()
    horizon: datetime = now + timedelta(seconds=window_s or settings.TICK_PLANNING_WINDOW_S)
    params: dict[str, Any] = {
        "shards": list(range(settings.TICK_SHARDS)),
        "after": DISTANT_PAST,
        "until": horizon,
        "limit": limit or settings.TICK_MATERIALIZE_BATCH,
    }
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + SELECT_DUE, params)
        plan = [line for (line,) in cursor.fetchall()]
        transaction.set_rollback(True)
    return plan
