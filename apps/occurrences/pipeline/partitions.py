"""Daily range partitions of the occurrence and attempt tables.

Partitions are plain `CREATE TABLE IF NOT EXISTS … PARTITION OF` statements: idempotent, safe
to run from several processes (a concurrent creation of the same day is taken as done), and
with no DEFAULT partition (one could later block creating the partition that covers its
rows). Retention drops whole days: no row-by-row DELETE.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta

from django.db import IntegrityError, ProgrammingError, connection, transaction
from django.db.backends.utils import CursorWrapper

from apps.tenants.rls import partition_rls_sql

PARTITIONED_TABLES = ("occurrences_occurrence", "occurrences_attempt")
_SUFFIX = re.compile(r"_p(\d{8})$")

# Days known to exist in this process; creating is idempotent, this only saves round trips.
_known_days: set[date] = set()


@dataclass
class PartitionReport:
    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


def partition_name(table: str, day: date) -> str:
    return f"{table}_p{day:%Y%m%d}"


def _bounds(day: date) -> tuple[datetime, datetime]:
    start = datetime.combine(day, time.min, tzinfo=UTC)
    return start, start + timedelta(days=1)


def partitions_ensure(days: Iterable[date]) -> list[str]:
    """Create the daily partitions covering `days` (all partitioned tables); returns new ones.

    Runs in its own autocommit statements: DDL must not sit inside a hot-path transaction.
    """
    wanted = sorted(set(days) - _known_days)
    created: list[str] = []
    if not wanted:
        return created
    with connection.cursor() as cursor:
        for day in wanted:
            start, end = _bounds(day)
            for table in PARTITIONED_TABLES:
                name = partition_name(table, day)
                cursor.execute("SELECT to_regclass(%s) IS NULL", [name])
                row = cursor.fetchone()
                if row and row[0] and _create(cursor, name, table, start, end):
                    created.append(name)
            _known_days.add(day)
    return created


# Free space left in each page of an occurrence partition, so that the relay's record and the
# claim (which change no indexed column) can write the new row version into the same page: a
# HOT update, no new index entries (docs/decisions.md "PostgreSQL work per occurrence"). Half
# of each page: an occurrence is written three times (record, claim, completion) before
# vacuum frees the old versions (docs/decisions.md "Delivery path: fewer writes per
# occurrence"). Attempts gain nothing: each of their updates changes an indexed column.
PARTITION_FILLFACTOR = {"occurrences_occurrence": 50}


def _storage(table: str) -> str:
    fillfactor = PARTITION_FILLFACTOR.get(table)
    return f" WITH (fillfactor = {int(fillfactor)})" if fillfactor else ""


def _create(cursor: CursorWrapper, name: str, table: str, start: datetime, end: datetime) -> bool:
    """Create one partition; False if another process created it first. `IF NOT EXISTS`
    is not safe against a concurrent CREATE of the same name (PostgreSQL then raises a
    duplicate), so that error is taken as "exists" once the name resolves. The savepoint keeps
    a caller's transaction usable."""
    try:
        with transaction.atomic():
            cursor.execute(
                f'CREATE TABLE IF NOT EXISTS "{name}" PARTITION OF "{table}" '
                f"FOR VALUES FROM (%s) TO (%s){_storage(table)}",
                [start, end],
            )
            # Deny-all RLS on the partition itself, in the same DDL (docs/decisions.md
            # "Row-level security"): reads go through the parent's policy.
            cursor.execute(partition_rls_sql(name))
        return True
    except (ProgrammingError, IntegrityError):
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
        found = cursor.fetchone()
        if found and found[0]:
            return False
        raise


def partitions_absent(days: Iterable[date]) -> set[date]:
    """Days whose partitions do not exist, checked without DDL (for a process that may not
    create tables: a web request runs as the restricted web role); present days are
    remembered like created ones."""
    absent: set[date] = set()
    unknown = sorted(set(days) - _known_days)
    if not unknown:
        return absent  # the worker's claim asks on every occurrence: no cursor for a known day
    with connection.cursor() as cursor:
        for day in unknown:
            names = [partition_name(table, day) for table in PARTITIONED_TABLES]
            cursor.execute(
                "SELECT bool_and(to_regclass(n) IS NOT NULL) FROM unnest(%s::text[]) AS n",
                [names],
            )
            row = cursor.fetchone()
            if row and row[0]:
                _known_days.add(day)
            else:
                absent.add(day)
    return absent


def partitions_missing(days: Iterable[date]) -> set[date]:
    """Days not known to have partitions in this process (cheap: no query)."""
    return set(days) - _known_days


def partitions_forget() -> None:
    """Drop the per-process cache (tests roll partition DDL back with their transaction)."""
    _known_days.clear()


def partitions_ensure_for_range(start: datetime, end: datetime) -> list[str]:
    first, last = start.astimezone(UTC).date(), end.astimezone(UTC).date()
    return partitions_ensure(first + timedelta(days=n) for n in range((last - first).days + 1))


def existing_partitions(table: str) -> dict[date, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = %s::regclass",
            [table],
        )
        names = [row[0] for row in cursor.fetchall()]
    found: dict[date, str] = {}
    for name in names:
        match = _SUFFIX.search(name)
        if match:
            found[datetime.strptime(match.group(1), "%Y%m%d").replace(tzinfo=UTC).date()] = name
    return found


def partitions_maintain(*, today: date, days_ahead: int, retention_days: int) -> PartitionReport:
    """Create partitions from yesterday to `days_ahead`; drop days older than retention.

    Yesterday is kept creatable so late recovery (misfire bookkeeping) always has a home.
    """
    report = PartitionReport()
    report.created = partitions_ensure(today + timedelta(days=n) for n in range(-1, days_ahead + 1))
    cutoff = today - timedelta(days=retention_days)
    with connection.cursor() as cursor:
        # Attempts first: they describe occurrences, never the other way round.
        for table in ("occurrences_attempt", "occurrences_occurrence"):
            for day, name in sorted(existing_partitions(table).items()):
                if day < cutoff:
                    cursor.execute(f'DROP TABLE IF EXISTS "{name}"')
                    report.dropped.append(name)
                    _known_days.discard(day)
    return report
