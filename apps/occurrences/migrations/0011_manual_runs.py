"""Run now and backfill (docs/decisions.md "Run now and backfill"): an occurrence's `origin`
and `requested_by`, and the instant key widened by `origin`.

The occurrences table is partitioned and hot, so nothing here rewrites it or holds its lock
for long:
- both columns have a constant default: PostgreSQL records it in the catalogue and rewrites
  no partition;
- the new unique index is built per partition with CREATE INDEX CONCURRENTLY (writes go on)
  and attached to an index created ON ONLY the parent, which turns valid once every partition
  has one; partitions created later get it from the parent. Only then is the old constraint
  dropped (a short catalogue lock). Hence a non-atomic migration.
"""

from typing import Any

from django.db import migrations, models

TABLE = "occurrences_occurrence"
INDEX = "occurrence_instant_origin_uniq"
COLUMNS = "(schedule_id, schedule_version, scheduled_for, origin)"


def _partitions(cursor: Any) -> list[str]:
    cursor.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = %s::regclass ORDER BY c.relname",
        [TABLE],
    )
    return [row[0] for row in cursor.fetchall()]


def build_index(apps: Any, schema_editor: Any) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f'CREATE UNIQUE INDEX IF NOT EXISTS "{INDEX}" ON ONLY "{TABLE}" {COLUMNS}')
        for partition in _partitions(cursor):
            child = f"{partition}_instant_origin_uniq"
            cursor.execute(
                f'CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS "{child}" '
                f'ON "{partition}" {COLUMNS}'
            )
            cursor.execute(
                "SELECT 1 FROM pg_inherits WHERE inhrelid = %s::regclass "
                "AND inhparent = %s::regclass",
                [child, INDEX],
            )
            if cursor.fetchone() is None:
                cursor.execute(f'ALTER INDEX "{INDEX}" ATTACH PARTITION "{child}"')
        cursor.execute(f'ALTER TABLE "{TABLE}" DROP CONSTRAINT IF EXISTS occurrence_instant_uniq')


def drop_index(apps: Any, schema_editor: Any) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            f'ALTER TABLE "{TABLE}" ADD CONSTRAINT occurrence_instant_uniq '
            "UNIQUE (schedule_id, schedule_version, scheduled_for)"
        )
        cursor.execute(f'DROP INDEX IF EXISTS "{INDEX}"')


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("occurrences", "0010_tenant_rate_bucket")]

    operations: list[migrations.operations.base.Operation] = [
        migrations.AddField(
            model_name="occurrence",
            name="origin",
            field=models.CharField(
                choices=[
                    ("scheduled", "Scheduled"),
                    ("manual", "Run now"),
                    ("backfill", "Backfill"),
                ],
                db_default="scheduled",
                default="scheduled",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="occurrence",
            name="requested_by",
            field=models.CharField(blank=True, db_default="", default="", max_length=200),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(
                    model_name="occurrence", name="occurrence_instant_uniq"
                ),
                migrations.AddConstraint(
                    model_name="occurrence",
                    constraint=models.UniqueConstraint(
                        fields=("schedule", "schedule_version", "scheduled_for", "origin"),
                        name=INDEX,
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(build_index, drop_index)],
        ),
    ]
