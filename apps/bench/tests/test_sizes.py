"""The database figures of `bench_burst --extra-active`: sizes per table and index, and the
due scan's plan, which must read the due index without sorting what it finds."""

from __future__ import annotations

import pytest
from django.db import connection

from apps.bench.sizes import GROWING_TABLES, due_scan_plan, index_sizes, relation_sizes
from apps.schedules.tests.factories import make_schedule

pytestmark = pytest.mark.django_db


def test_sizes_cover_every_growing_table_and_each_schedule_index(tenant_a):
    for _ in range(3):
        make_schedule(tenant_a)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE schedules_schedule")

    sizes = relation_sizes()
    indexes = index_sizes("schedules_schedule")

    assert set(sizes) == set(GROWING_TABLES)
    assert sizes["schedules_schedule"]["rows"] == 3
    assert set(sizes["schedules_schedule"]) == {"table_mib", "indexes_mib", "rows"}
    assert "schedule_due_idx" in indexes and "schedules_schedule_pkey" in indexes


def test_the_due_scan_reads_an_index_up_to_its_limit_and_sorts_nothing(tenant_a):
    for _ in range(3):
        make_schedule(tenant_a)
    with connection.cursor() as cursor:
        # A three-row table would be scanned whole; the plan that matters is the indexed one.
        cursor.execute("SET LOCAL enable_seqscan = off")

        plan = "\n".join(due_scan_plan())

    assert "Limit" in plan and "Index Scan" in plan
    # An ORDER BY next_run_at with `shard = ANY(…)` fetches and sorts every due row per batch.
    assert "Sort" not in plan
