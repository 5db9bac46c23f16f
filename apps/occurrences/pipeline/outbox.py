"""The one writer of outbox rows: the INSERT every path that queues an occurrence embeds.

A row of `occurrences_dispatchoutbox` is what the relay publishes (relay.py). The
materializer, run now and backfill, resume, the backstop (redelivery.py) and the execution
path's retry lane (execution/requeue.py) each build a different SELECT, but the row they
write is spelled here once, column by column by name, so a new column or a changed meaning
is one edit. The SQL stays set-based: the caller's statement supplies the rows (a CTE or
plain values); this module only writes the INSERT around them.
"""

from __future__ import annotations

OUTBOX_COLUMNS = (
    "occurrence_id", "scheduled_for", "schedule_id", "schedule_version", "tenant_id", "shard",
    "lane", "available_at", "created_at",
)  # fmt: skip


def outbox_insert(
    *,
    occurrence_id: str = "occurrence_id",
    scheduled_for: str = "scheduled_for",
    schedule_id: str = "schedule_id",
    schedule_version: str = "schedule_version",
    tenant_id: str = "tenant_id",
    shard: str = "shard",
    lane: str = "lane",
    available_at: str = "available_at",
    created_at: str = "%(now)s",
    source: str = "",
    returning: str = "",
) -> str:
    """`INSERT INTO occurrences_dispatchoutbox (…) SELECT … <source> <returning>`: each
    argument is the SQL expression for its column (a column of `source`, or a parameter
    such as `%(now)s`); a column not named is read from the source's column of the same
    name, and `created_at` is the statement's `%(now)s`. `source` is the FROM clause with
    any JOIN and WHERE (empty for one row of parameters); `returning` e.g. `RETURNING 1`
    when a CTE counts the rows."""
    values = (occurrence_id, scheduled_for, schedule_id, schedule_version, tenant_id, shard,
              lane, available_at, created_at)  # fmt: skip
    return (
        f"INSERT INTO occurrences_dispatchoutbox ({', '.join(OUTBOX_COLUMNS)})\n"
        f"SELECT {', '.join(values)}\n{source}\n{returning}"
    )
