"""The worker's per-occurrence statements as server-side prepared statements.

A claim runs two statements and a completion one for every occurrence (claim.py `_LOCK_ROW`
and `_OPEN_ATTEMPT`, complete.py `_RECORD_HELD`). Bound client-side, as Django binds every
statement, PostgreSQL parses, analyzes and plans each of them afresh on every execution,
against partitioned tables; that, not the rows they touch, was most of their CPU
(docs/performance.md "Execution path under sustained load"). Here they are executed with
server-side binding and prepared on the connection the first time (psycopg's statement
cache, per connection), so later executions skip the parse and the planning (below).

Only where prepared statements can live: a connection behind a transaction-mode pooler has
`prepare_threshold=None` (tickweb/settings.py `DATABASE_POOLER`: PgBouncer 1.18 does not keep
a statement prepared on one server connection for the next client, docs/decisions.md
"PgBouncer in transaction mode, prepared statements off"); there the statement runs as any
other, bound client-side. So does it while execute wrappers are installed (none are on the
worker's connections) so that nothing they add is skipped.

Each such connection plans them once: `plan_cache_mode = force_generic_plan` is set on it
as it opens (Django's `connection_created`, in autocommit). Left to PostgreSQL's choice
(`auto`), every execution was planned afresh — a custom plan each time (pg_prepared_statements:
0 generic and 420 custom of 420), a generic plan over the partitioned tables being costed
above one pruned to the row's partition — so preparing saved the parse only. The generic
plans prune the partitions at execution instead (docs/decisions.md "The worker's
per-occurrence statements prepared"). The setting is the session's, and only prepared
statements heed it: Django's client-side bound statements are planned as before.

Even a generic plan over a partitioned table is costly for a statement that touches one row:
executing it locks every partition and their indexes before pruning them (56 relation locks
for one occurrence row with nine daily partitions, against eight for the partition alone, and
more with each day retention keeps), most of them past the backend's sixteen fast-path lock
slots. So the rows an occurrence's claim and completion change are named by their day
partition (`on_row_partitions`, placeholders `OCCURRENCE_ROW_TABLE`/`ATTEMPT_ROW_TABLE`);
a statement over a tenant's attempts of every day keeps the partitioned table. Each day's
text is its own prepared statement. A day that retention may be dropping (within a day of
`TICK_RETENTION_DAYS`) keeps the partitioned tables, so a statement never names a partition
that is gone: a row there is found, or not, through its parent (docs/decisions.md "The
worker's statements name the row's partition").

The statement runs on the connection's own session and transaction; errors are Django's
(`OperationalError` for an outage, which the callers ride out), and a debug cursor logs it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from django.conf import settings
from django.db.backends.signals import connection_created
from django.db.backends.utils import CursorWrapper
from django.dispatch import receiver

from apps.occurrences.pipeline.partitions import partition_name, partitions_absent


def prepared(cursor: CursorWrapper) -> bool:
    """Whether statements on this cursor's connection are prepared (module docstring)."""
    db = cursor.db
    raw = db.connection
    return (
        raw is not None
        and getattr(raw, "prepare_threshold", None) is not None
        and not db.execute_wrappers
    )


# Set on every connection whose statements can be prepared, as it opens (module docstring).
GENERIC_PLANS = "SET plan_cache_mode = force_generic_plan"


@receiver(connection_created)
def _generic_plans(sender: Any, connection: Any, **_: Any) -> None:
    raw = connection.connection
    if getattr(raw, "prepare_threshold", None) is not None:
        raw.execute(GENERIC_PLANS)


OCCURRENCE_ROW_TABLE = "{occurrence_row_table}"
ATTEMPT_ROW_TABLE = "{attempt_row_table}"


def on_row_partitions(sql: str, scheduled_for: datetime, now: datetime) -> str:
    """`sql` with `OCCURRENCE_ROW_TABLE` and `ATTEMPT_ROW_TABLE` naming the day partitions
    that hold the rows of `scheduled_for`, or the partitioned tables for a day that has no
    partitions or that retention may be dropping (module docstring). A day not yet seen costs
    one catalog query, then is remembered (pipeline/partitions.py `partitions_absent`)."""
    day = scheduled_for.astimezone(UTC).date()
    oldest_kept = now.astimezone(UTC).date() - timedelta(days=settings.TICK_RETENTION_DAYS - 1)
    if day < oldest_kept or partitions_absent([day]):
        return on_partitioned_tables(sql)
    occurrence = partition_name("occurrences_occurrence", day)
    attempt = partition_name("occurrences_attempt", day)
    return sql.replace(OCCURRENCE_ROW_TABLE, occurrence).replace(ATTEMPT_ROW_TABLE, attempt)


def on_partitioned_tables(sql: str) -> str:
    """`sql` with `OCCURRENCE_ROW_TABLE` and `ATTEMPT_ROW_TABLE` naming the partitioned
    tables: for rows of several days."""
    return sql.replace(OCCURRENCE_ROW_TABLE, "occurrences_occurrence").replace(
        ATTEMPT_ROW_TABLE, "occurrences_attempt"
    )


def execute_prepared(cursor: CursorWrapper, sql: str, params: Mapping[str, Any]) -> Any:
    """Execute `sql` with `params`, prepared on the connection when it can be (module
    docstring); returns a cursor to fetch the result from."""
    if not prepared(cursor):
        cursor.execute(sql, params)
        return cursor
    db = cursor.db
    server_cursor = psycopg.Cursor(db.connection)
    started = time.monotonic()
    with db.wrap_database_errors:
        server_cursor.execute(sql, params, prepare=True)
    if db.queries_logged:
        db.queries_log.append({"sql": sql, "time": f"{time.monotonic() - started:.3f}"})
    return server_cursor
