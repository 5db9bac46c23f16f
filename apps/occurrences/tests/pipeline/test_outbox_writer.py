"""Outbox rows are written by one SQL fragment (apps/occurrences/pipeline/outbox.py): a second
hand-written INSERT would drift from it the day the row gains a column."""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings

from apps.occurrences.pipeline.outbox import OUTBOX_COLUMNS, outbox_insert

WRITER = Path("apps/occurrences/pipeline/outbox.py")
# Benchmarks measure a lean-SQL floor of their own on purpose (docs/performance.md).
OFF_PRODUCT = ("tests", "migrations", "bench")


def test_only_the_outbox_module_spells_the_insert() -> None:
    root = Path(settings.BASE_DIR)
    insert = re.compile(r"INSERT\s+INTO\s+occurrences_dispatchoutbox", re.IGNORECASE)
    found = [
        str(path.relative_to(root))
        for path in sorted((root / "apps").rglob("*.py"))
        if not set(path.relative_to(root).parts) & set(OFF_PRODUCT)
        and path.relative_to(root) != WRITER
        and insert.search(path.read_text())
    ]
    assert found == []


def test_every_column_gets_its_expression_by_name() -> None:
    sql = outbox_insert(
        occurrence_id="o", scheduled_for="f", schedule_id="s", schedule_version="v",
        tenant_id="t", shard="h", lane="l", available_at="a", created_at="c",
        source="FROM x", returning="RETURNING 1",
    )  # fmt: skip
    assert f"({', '.join(OUTBOX_COLUMNS)})" in sql
    assert "SELECT o, f, s, v, t, h, l, a, c\nFROM x\nRETURNING 1" in sql


def test_a_column_not_named_is_read_from_the_source_column_of_its_name() -> None:
    sql = outbox_insert(occurrence_id="id", lane="%(lane)s", source="FROM x")
    assert (
        "SELECT id, scheduled_for, schedule_id, schedule_version, tenant_id, shard, %(lane)s, "
        "available_at, %(now)s\nFROM x\n"
    ) in sql
