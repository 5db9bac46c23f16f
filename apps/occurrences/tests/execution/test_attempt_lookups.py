"""The worker's statements find an attempt by its key through the primary key, never by
scanning an open-attempt partial index: under load such an index holds an entry for every
attempt closed since the last vacuum (docs/decisions.md "Attempts found by their key")."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.utils import timezone

from apps.occurrences.execution import complete, complete_batch, envelope_run
from apps.occurrences.execution.statements import on_row_partitions
from apps.occurrences.pipeline.partitions import partition_name, partitions_ensure

pytestmark = pytest.mark.django_db

# Statements the worker prepares (statements.py): one lookup of attempts by key or more each.
PREPARED = {
    "the run's completion": complete_batch._SUCCEED_AND_CLOSE,
    "a completion on its own": complete._RECORD_HELD,
    "a run's lease renewal": envelope_run._RENEW,
}


def _partial_indexes(table: str) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = %s::regclass AND i.indpred IS NOT NULL",
            [table],
        )
        return {row[0] for row in cursor.fetchall()}


def _generic_plan(sql: str) -> str:
    """EXPLAIN of `sql`'s generic plan, as a worker's connection runs it (statements.py)."""
    names: list[str] = []

    def placeholder(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    numbered = re.sub(r"%\((\w+)\)s", placeholder, sql)
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        # The tables are tiny here; what matters is which indexes the lookups may take.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"PREPARE lookup AS {numbered}")
        try:
            cursor.execute(f"EXPLAIN EXECUTE lookup({', '.join(['NULL'] * len(names))})")
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE lookup")


@pytest.mark.parametrize("name", sorted(PREPARED))
def test_a_prepared_statement_finds_attempts_through_the_primary_key(name: str) -> None:
    now = timezone.now()
    partitions_ensure([now.date()])
    attempts = partition_name("occurrences_attempt", now.date())
    partial = _partial_indexes(attempts)
    assert len(partial) == 2, partial  # the reaper's and the tenant count's

    plan = _generic_plan(on_row_partitions(PREPARED[name], now, now))

    assert f"{attempts}_pkey" in plan, plan
    assert not any(index in plan for index in partial), plan
