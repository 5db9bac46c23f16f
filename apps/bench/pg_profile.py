"""What PostgreSQL did during a benchmark: per statement, per table, WAL and CPU.

- Statements: `pg_stat_statements` (calls, total and mean time, rows, WAL bytes and full-page
  images per normalised statement), grouped into the pipeline's phases by what they touch.
  The extension needs `shared_preload_libraries = 'pg_stat_statements'`, which takes a
  server restart: the profile says "unavailable" on a server without it (docs/performance.md
  "Profiling PostgreSQL" starts one that has it).
- Tables: `pg_stat_user_tables` summed over each table's partitions (inserts, updates, HOT
  updates, deletes, dead tuples, autovacuum and autoanalyze runs).
- WAL: `pg_stat_wal` (records, full-page images, bytes).
- CPU: the process tree of the server this database runs on, found through its
  `postmaster.pid`, so another cluster on the same machine is not counted; the bench's
  own backend alone through `pg_backend_pid()`.

`profile_reset()` at the start of the measured window, `profile_read()` at its end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from django.db import connection

from apps.bench.processes import proc_cpu_s

# The tables whose counters the profile reports; partitions are summed into their parent.
PROFILED_TABLES = (
    "occurrences_occurrence",
    "occurrences_attempt",
    "occurrences_dispatchoutbox",
    "schedules_schedule",
)
TOP_STATEMENTS = 5
# Statements kept in the profile (by total time): the report's JSON stays small.
KEPT_STATEMENTS = 40


class Phase:
    """The pipeline phases a statement is counted in (by the first pattern it matches)."""

    MATERIALIZE = "materialize"
    RELAY = "relay"
    CLAIM = "claim"
    COMPLETE = "complete"
    LEASES = "leases"
    BENCH = "bench"
    OTHER = "other"


# Ordered: the first match wins. Case-insensitive, over the normalised statement text.
_PHASE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (phase, re.compile(pattern, re.IGNORECASE | re.DOTALL))
    for phase, pattern in (
        (Phase.BENCH, r"bench_received|pg_stat_|pg_partition_tree|pg_current_wal_lsn"),
        (Phase.LEASES, r"occurrences_shardlease|occurrences_leasemember"),
        # The completion's lease check; the claim's tenant/schedule locks and its count of
        # the tenant's open attempts (only the execution path takes advisory locks).
        (Phase.COMPLETE, r"^\s*select \$1 from occurrences_attempt where id"),
        (Phase.CLAIM, r"pg_advisory_xact_lock|from occurrences_attempt where tenant_id"),
        (Phase.CLAIM, r"insert into occurrences_attempt|occurrences_tenantactivity"),
        (Phase.COMPLETE, r"update occurrences_attempt"),
        (Phase.MATERIALIZE, r"from schedules_schedule|update schedules_schedule|"
                            r"insert into occurrences_occurrence"),
        (Phase.RELAY, r"occurrences_dispatchoutbox|occurrences_relaystaging|"
                      r"occurrences_tenantratebucket"),
        (Phase.CLAIM, r"set state = \$\d+, attempt_count|from occurrences_occurrence"),
        (Phase.COMPLETE, r"update occurrences_occurrence set state = \$\d+, finished_at"),
    )
)  # fmt: skip


def phase_of(query: str) -> str:
    for phase, pattern in _PHASE_PATTERNS:
        if pattern.search(query):
            return phase
    return Phase.OTHER


@dataclass
class StatementFigures:
    query: str
    phase: str
    calls: int
    total_ms: float
    mean_ms: float
    rows: int
    wal_bytes: int
    wal_fpi: int


@dataclass
class TableFigures:
    inserted: int
    updated: int
    hot_updated: int
    deleted: int
    dead: int
    autovacuums: int
    autoanalyzes: int

    @property
    def hot_share(self) -> float | None:
        return self.hot_updated / self.updated if self.updated else None


@dataclass
class WalFigures:
    records: int = 0
    fpi: int = 0
    bytes: int = 0


@dataclass
class Profile:
    """The counters since `profile_reset()`; `statements` empty when unavailable."""

    statements_available: bool
    statements: list[StatementFigures] = field(default_factory=list)
    tables: dict[str, TableFigures] = field(default_factory=dict)
    wal: WalFigures = field(default_factory=WalFigures)

    def phases(self) -> dict[str, dict[str, float]]:
        """Per phase: statement time (ms), calls and WAL bytes, summed."""
        out: dict[str, dict[str, float]] = {}
        for s in self.statements:
            sums = out.setdefault(s.phase, {"total_ms": 0.0, "calls": 0, "wal_bytes": 0})
            sums["total_ms"] = round(sums["total_ms"] + s.total_ms, 1)
            sums["calls"] += s.calls
            sums["wal_bytes"] += s.wal_bytes
        return out

    def lines(self, *, top: int = TOP_STATEMENTS) -> list[str]:
        out = [
            f"  WAL: {self.wal.bytes / 2**20:.1f} MiB in {self.wal.records:,} records, "
            f"{self.wal.fpi:,} full-page images"
        ]
        for name, t in self.tables.items():
            hot = "-" if t.hot_share is None else f"{t.hot_share:.0%}"
            out.append(
                f"  {name}: ins {t.inserted:,} upd {t.updated:,} (HOT {hot}) del {t.deleted:,} "
                f"dead {t.dead:,} autovacuum {t.autovacuums} autoanalyze {t.autoanalyzes}"
            )
        if not self.statements_available:
            out.append("  statements: pg_stat_statements unavailable (not preloaded)")
            return out
        for phase, sums in sorted(self.phases().items(), key=lambda kv: -kv[1]["total_ms"]):
            out.append(
                f"  phase {phase}: {sums['total_ms'] / 1000:.1f} s in {int(sums['calls']):,} "
                f"calls, WAL {sums['wal_bytes'] / 2**20:.1f} MiB"
            )
            ranked = sorted(
                (s for s in self.statements if s.phase == phase), key=lambda s: -s.total_ms
            )
            for s in ranked[:top]:
                text = " ".join(s.query.split())[:110]
                out.append(
                    f"    {s.total_ms / 1000:7.2f} s {s.calls:>8,} calls {s.mean_ms:8.3f} ms "
                    f"{s.rows:>10,} rows WAL {s.wal_bytes / 2**20:7.1f} MiB  {text}"
                )
        return out


def statements_available() -> bool:
    """Whether pg_stat_statements is loaded on the server (created in this database if so)."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW shared_preload_libraries")
        row = cursor.fetchone()
        if "pg_stat_statements" not in (row[0] if row else ""):
            return False
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return True


def profile_reset() -> bool:
    """Zero the statement, table and WAL counters; returns whether statements are profiled."""
    available = statements_available()
    with connection.cursor() as cursor:
        if available:
            cursor.execute("SELECT pg_stat_statements_reset()")
        cursor.execute("SELECT pg_stat_reset()")  # this database's table counters
        cursor.execute("SELECT pg_stat_reset_shared('wal')")
    return available


def _statements(cursor: Any) -> list[StatementFigures]:
    cursor.execute(
        "SELECT s.query, s.calls, s.total_exec_time + s.total_plan_time, s.mean_exec_time, "
        "       s.rows, s.wal_bytes, s.wal_fpi "
        "FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
        "WHERE d.datname = current_database() ORDER BY 3 DESC LIMIT %s",
        [KEPT_STATEMENTS],
    )
    return [
        StatementFigures(
            query=query,
            phase=phase_of(query),
            calls=calls,
            total_ms=round(total, 1),
            mean_ms=round(mean, 3),
            rows=rows,
            wal_bytes=int(wal),
            wal_fpi=fpi,
        )  # fmt: skip
        for query, calls, total, mean, rows, wal, fpi in cursor.fetchall()
    ]


_TABLES_SQL = """
    SELECT t.name, coalesce(sum(s.n_tup_ins), 0), coalesce(sum(s.n_tup_upd), 0),
           coalesce(sum(s.n_tup_hot_upd), 0), coalesce(sum(s.n_tup_del), 0),
           coalesce(sum(s.n_dead_tup), 0), coalesce(sum(s.autovacuum_count), 0),
           coalesce(sum(s.autoanalyze_count), 0)
      FROM unnest(%s::text[]) AS t(name)
      CROSS JOIN LATERAL (SELECT relid FROM pg_partition_tree(t.name::regclass)
                          UNION SELECT t.name::regclass) p
      JOIN pg_stat_user_tables s ON s.relid = p.relid
  GROUP BY t.name
"""


def profile_read() -> Profile:
    """The counters since `profile_reset()` (pending statistics of this backend flushed)."""
    available = statements_available()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT 1")  # the flush happens at the end of a statement
        statements = _statements(cursor) if available else []
        cursor.execute(_TABLES_SQL, [list(PROFILED_TABLES)])
        tables = {row[0]: TableFigures(*(int(v) for v in row[1:])) for row in cursor.fetchall()}
        cursor.execute("SELECT wal_records, wal_fpi, wal_bytes FROM pg_stat_wal")
        row = cursor.fetchone()
        wal = WalFigures(int(row[0]), int(row[1]), int(row[2])) if row else WalFigures()
    return Profile(available, statements, tables, wal)


# -- CPU -----------------------------------------------------------------------------------


def backend_cpu_s() -> float:
    """CPU seconds of this connection's own backend so far (0 when it is not local)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        row = cursor.fetchone()
    return proc_cpu_s(int(row[0])) if row else 0.0
