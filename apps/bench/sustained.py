"""Sustained-load benchmark of the delivery path (wrapped by `manage.py bench_sustained`).

A day's volume is a rate, not a burst: R occurrences come due every minute for M minutes,
(1 - flexible share) of them strict at the minute and the rest flexible, each spread over a
300 s window. Strict schedules fire every minute; flexible ones every 5 minutes with their
minute offset staggered, so the same number come due each minute and a window never runs
into the schedule's next instant. Schedules are spread round-robin over T tenants. Setup
writes them with COPY (`bench.fixtures`), `next_run_at` computed with Tick's own rule code.

Real `manage.py materialize` and `relay` processes (several of each, sharing the shard
leases) do the work on a private queue prefix; an independent consumer (a thread on its own
AMQP connection) acks everything and writes each received occurrence id to a file. After a
warm-up until the first whole minute the run is measured minute by minute:

- from the stored rows: strict count and p99 lag `enqueued_at - scheduled_for`, flexible
  count and p99 lag `enqueued_at - available_at` (each row in the minute of its reference
  instant), rows enqueued before their reference (early), rows written after their
  `scheduled_for` (the materializer fell behind), rows enqueued in that minute;
- sampled: outbox depth (all rows, and those already due: the relay's backlog), the CPU
  seconds of each process kind (materialize, relay, postgresql, rabbitmq, bench), the WAL
  bytes PostgreSQL wrote, the growth of the occurrence table (all partitions) and of the
  outbox, partitions created or dropped.

At the end Tick's reconciliation audit runs over the measured window for each bench tenant
(missing must be 0), and the consumer's ids are compared with the stored rows (missing,
duplicates). Everything is removed afterwards, also on failure.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from django.conf import settings
from django.db import connection
from django.utils import timezone

from apps.bench.burst import PIPELINE_COMMANDS
from apps.bench.consumer import OccurrenceConsumer
from apps.bench.execution_path import (
    EXECUTION_HANDLER,
    BareCeleryFloor,
    ExecutionWork,
    bare_celery_floor,
    stored_execution,
    unfinished_count,
    worker_tree_cpu,
)
from apps.bench.fixtures import (
    BENCH_HANDLER,
    ScheduleBatch,
    bench_tenants,
    bench_tenants_delete,
    copy_into,
    cron_definition,
    next_whole_minute,
)
from apps.bench.floor import DELIVERY_PHASES, FloorReport, bench_floor
from apps.bench.pg_profile import Profile, profile_read, profile_reset
from apps.bench.processes import (
    WORKER_KIND,
    BenchProcesses,
    backend_cpu,
    backend_cpu_diff,
    backend_cpu_seen,
    declare_topology,
    delete_topology,
    proc_cpu_s,
    services_cpu,
)
from apps.occurrences.audit.reconcile import reconcile
from apps.occurrences.models import Lane
from apps.occurrences.pipeline.partitions import PARTITIONED_TABLES, existing_partitions
from apps.occurrences.pipeline.queues import all_queue_names
from apps.schedules import timerules
from apps.schedules.models import Schedule

FLEXIBLE_WINDOW_S = 300
# A flexible schedule fires every this many minutes: its window fits inside its period.
FLEXIBLE_PERIOD_MIN = 5
# "Held": every minute's strict p99 at most this (docs/performance.md "Sustained").
HELD_STRICT_P99_S = 5.0
# ... and, with workers executing, the start lag's p99 at most this (docs/performance.md
# "Execution path under sustained load").
HELD_START_LAG_P99_S = 10.0
SAMPLE_EVERY_S = 5.0
# An outbox row due longer ago than this counts as the relay's backlog.
OVERDUE_S = 1.0
# "Held": no sampled outbox row had been due longer than this (the relay kept up). A bound on
# lateness, not a row count: a count judged against one second's occurrences misreads a
# steady backlog of a second at a low rate, and a minute's published rows not yet recorded
# at a high one (docs/performance.md "Sustained").
HELD_OUTBOX_LATENESS_S = 10.0
# After the last measured minute: how long to wait for its due rows to be enqueued.
DRAIN_S = 30.0
# A run of at least FLATNESS_MIN_MINUTES reports PostgreSQL's work per occurrence per block of
# BLOCK_MINUTES and whether its first and last blocks agree within FLAT_WITHIN (the CPU target
# in docs/performance.md "Sustained": flat from the first to the last five minutes).
FLATNESS_MIN_MINUTES = 10
BLOCK_MINUTES = 5
FLAT_WITHIN = 0.20
BENCH_KIND = "bench"
OCCURRENCE_TABLE = "occurrences_occurrence"
OUTBOX_TABLE = "occurrences_dispatchoutbox"


# -- the plan ------------------------------------------------------------------------------


class PlannedSchedule(NamedTuple):
    tenant: int  # index into the bench tenants
    expression: str
    precision: Schedule.Precision
    window_s: int


@dataclass(frozen=True)
class SpreadPlan:
    """Schedules such that `per_minute` occurrences come due every minute, a
    `flexible_share` of them flexible, spread round-robin over `tenants`."""

    per_minute: int
    flexible_share: float
    tenants: int

    @property
    def strict_per_minute(self) -> int:
        return round(self.per_minute * (1 - self.flexible_share))

    @property
    def flexible_per_minute(self) -> int:
        return self.per_minute - self.strict_per_minute

    @property
    def schedule_count(self) -> int:
        return self.strict_per_minute + self.flexible_per_minute * FLEXIBLE_PERIOD_MIN

    def schedules(self) -> Iterator[PlannedSchedule]:
        """Strict every-minute schedules, then the flexible ones: one block per minute offset
        of the 5-minute period, each block `flexible_per_minute` long."""
        for n in range(self.strict_per_minute):
            yield PlannedSchedule(n % self.tenants, "* * * * *", Schedule.Precision.STRICT, 0)
        for n in range(self.flexible_per_minute * FLEXIBLE_PERIOD_MIN):
            offset = n // self.flexible_per_minute
            yield PlannedSchedule(
                n % self.tenants,
                f"{offset}-59/{FLEXIBLE_PERIOD_MIN} * * * *",
                Schedule.Precision.FLEXIBLE,
                FLEXIBLE_WINDOW_S,
            )


def _load_schedules(
    plan: SpreadPlan,
    tenant_ids: list[uuid.UUID],
    first: datetime,
    say: Callable[[str], object],
    handler: str = BENCH_HANDLER,
) -> None:
    """COPY the plan's schedules, each with its first instant at or after `first`."""
    say(f"loading {plan.schedule_count:,} schedules from {first.isoformat()}…")
    now = timezone.now()
    after = first - timedelta(microseconds=1)
    firsts: dict[str, datetime] = {}
    definitions: dict[str, str] = {}
    batch, chunk = ScheduleBatch(), 0
    with connection.cursor() as cursor:
        for planned in plan.schedules():
            expression = planned.expression
            if expression not in firsts:
                found = timerules.next_fire_time(expression, "UTC", after)
                assert found is not None  # every rule here fires within 5 minutes
                firsts[expression] = found
                definitions[expression] = cron_definition(
                    expression, precision=planned.precision, window_s=planned.window_s,
                    handler=handler,
                )  # fmt: skip
            sid, tenant = uuid.uuid4(), tenant_ids[planned.tenant]
            batch.add_schedule(
                sid, tenant, expression=expression, time_zone="UTC",
                precision=planned.precision, flexible_window_s=planned.window_s,
                next_run_at=firsts[expression], created_at=now,
                definition=definitions[expression], handler=handler,
            )  # fmt: skip
            batch.add_created_event(sid, tenant, now)
            chunk += 1
            if chunk == 50_000:
                batch.copy(cursor)
                batch, chunk = ScheduleBatch(), 0
        batch.copy(cursor)
        cursor.execute("ANALYZE schedules_schedule")


# -- the consumer --------------------------------------------------------------------------


class IdConsumer(OccurrenceConsumer):
    """Appends each occurrence id it receives to `path`, one per line (the comparison with
    the stored rows happens in the database: a day's ids do not fit in this process)."""

    def __init__(self, broker_url: str, queues: list[str], path: Path) -> None:
        super().__init__(broker_url, queues)
        self.path = path
        self.received_count = 0
        self._out: TextIO | None = None

    def received(self, occurrence_id: str, arrived: float) -> None:
        assert self._out is not None
        self._out.write(occurrence_id + "\n")
        self.received_count += 1

    def run(self) -> None:
        with self.path.open("w", encoding="ascii") as self._out:
            super().run()


# -- stored rows: per-minute figures -------------------------------------------------------

# The bench's rows whose reference instant (flexible: available_at, otherwise scheduled_for)
# lies in [start, end). A flexible row may be scheduled up to its window before `start`.
_WINDOW_ROWS = """
    SELECT * FROM (
        SELECT o.id, o.lane, o.enqueued_at, o.created_at, o.scheduled_for,
               CASE WHEN o.lane = %(flexible_lane)s THEN o.available_at ELSE o.scheduled_for END
                   AS ref
          FROM occurrences_occurrence o
         WHERE o.tenant_id = ANY(%(tenants)s)
           AND o.scheduled_for >= %(lo)s AND o.scheduled_for < %(end)s
    ) r WHERE r.ref >= %(start)s AND r.ref < %(end)s
"""

# Per (minute, lane) and per lane over the whole window (minute NULL). percentile_disc
# ignores the NULL lags of rows not enqueued yet.
_LANE_FIGURES_SQL = f"""
    SELECT date_trunc('minute', ref), lane, count(*), count(enqueued_at),
           percentile_disc(0.99) WITHIN GROUP (
               ORDER BY extract(epoch FROM enqueued_at - ref)::float8),
           max(extract(epoch FROM enqueued_at - ref)::float8),
           count(*) FILTER (WHERE enqueued_at < ref),
           count(*) FILTER (WHERE created_at > scheduled_for),
           count(*) FILTER (WHERE lane = %(flexible_lane)s
                              AND enqueued_at > scheduled_for + make_interval(secs => %(window_s)s))
      FROM ({_WINDOW_ROWS}) w
  GROUP BY GROUPING SETS ((date_trunc('minute', ref), lane), (lane))
"""

_ENQUEUED_PER_MINUTE_SQL = """
    SELECT date_trunc('minute', enqueued_at), count(*)
      FROM occurrences_occurrence
     WHERE tenant_id = ANY(%(tenants)s) AND scheduled_for >= %(lo)s AND scheduled_for < %(end)s
       AND enqueued_at >= %(start)s AND enqueued_at < %(end)s
  GROUP BY 1
"""


@dataclass
class LaneFigures:
    """One lane's rows in one minute (or the whole window)."""

    count: int = 0
    enqueued: int = 0
    p99_s: float | None = None
    max_s: float | None = None
    early: int = 0
    materialized_late: int = 0
    past_window: int = 0  # flexible rows enqueued after their window's end


@dataclass
class StoredFigures:
    """What the stored rows say, per minute start and over the whole window."""

    minutes: dict[datetime, dict[str, LaneFigures]] = field(default_factory=dict)
    overall: dict[str, LaneFigures] = field(default_factory=dict)
    enqueued_per_minute: dict[datetime, int] = field(default_factory=dict)


def _window_params(tenant_ids: list[uuid.UUID], start: datetime, end: datetime) -> dict[str, Any]:
    return {
        "tenants": tenant_ids,
        "flexible_lane": Lane.FLEXIBLE,
        "window_s": FLEXIBLE_WINDOW_S,
        "lo": start - timedelta(seconds=FLEXIBLE_WINDOW_S),
        "start": start,
        "end": end,
    }


def stored_figures(tenant_ids: list[uuid.UUID], start: datetime, end: datetime) -> StoredFigures:
    """Per-minute lag, early and late-materialized counts of the tenants' rows whose
    reference instant lies in [start, end), plus the enqueues of each minute."""
    figures = StoredFigures()
    params = _window_params(tenant_ids, start, end)
    with connection.cursor() as cursor:
        cursor.execute(_LANE_FIGURES_SQL, params)
        for minute, lane, count, enqueued, p99, worst, early, late, past in cursor.fetchall():
            lane_figures = LaneFigures(
                count=count, enqueued=enqueued,
                p99_s=None if p99 is None else round(p99, 3),
                max_s=None if worst is None else round(worst, 3),
                early=early, materialized_late=late, past_window=past,
            )  # fmt: skip
            if minute is None:
                figures.overall[lane] = lane_figures
            else:
                figures.minutes.setdefault(minute, {})[lane] = lane_figures
        cursor.execute(_ENQUEUED_PER_MINUTE_SQL, params)
        figures.enqueued_per_minute = dict(cursor.fetchall())
    return figures


def consumer_check(
    tenant_ids: list[uuid.UUID], start: datetime, end: datetime, ids_path: Path
) -> tuple[int, int]:
    """(missing, duplicates): window rows enqueued but never received; extra receipts of
    window rows. The received ids are loaded into a temporary table."""
    params = _window_params(tenant_ids, start, end)
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE bench_received (id uuid NOT NULL)")
        try:
            with ids_path.open(encoding="ascii") as ids:
                while text := ids.read(16 << 20):
                    # A chunk ends mid-line: complete it from the next line.
                    text += ids.readline()
                    copy_into(cursor, "COPY bench_received (id) FROM STDIN", text)
            # Without statistics the planner takes the temporary table for a few rows and
            # joins millions of window rows against it by nested loop.
            cursor.execute("CREATE INDEX ON bench_received (id)")
            cursor.execute("ANALYZE bench_received")
            cursor.execute(
                f"SELECT count(*) FILTER (WHERE w.enqueued_at IS NOT NULL AND NOT EXISTS "
                f"(SELECT 1 FROM bench_received b WHERE b.id = w.id)) FROM ({_WINDOW_ROWS}) w",
                params,
            )
            missing = _one(cursor)
            cursor.execute(
                f"SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM bench_received "
                f"WHERE id IN (SELECT id FROM ({_WINDOW_ROWS}) w) GROUP BY id) d",
                params,
            )
            duplicates = _one(cursor)
        finally:
            cursor.execute("DROP TABLE bench_received")
    return missing, duplicates


def _one(cursor: Any) -> int:
    row = cursor.fetchone()
    return int(row[0]) if row and row[0] is not None else 0


# -- samples -------------------------------------------------------------------------------


@dataclass
class Reading:
    """Cumulative counters at one instant; two readings make a minute's figures."""

    cpu: dict[str, float]
    wal_lsn: str
    occurrence_bytes: int
    outbox_bytes: int
    partitions: set[str]
    # Per backend of a bench process: its kind and CPU seconds (processes.backend_cpu).
    backends: dict[int, tuple[str, float]] = field(default_factory=dict)


def _relation_bytes(cursor: Any, table: str) -> int:
    """A table's total size, its partitions (and theirs) included."""
    cursor.execute(
        "SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM pg_partition_tree(%s)",
        [table],
    )
    return _one(cursor)


def take_reading(procs: BenchProcesses) -> Reading:
    cpu = services_cpu()
    for name, proc in procs.procs.items():
        kind = procs.kinds[name]
        if kind != WORKER_KIND:
            cpu[kind] = cpu.get(kind, 0.0) + proc_cpu_s(proc.pid)
    cpu.update(worker_tree_cpu(procs) if WORKER_KIND in procs.kinds.values() else {})
    cpu[BENCH_KIND] = proc_cpu_s(os.getpid())  # the consumer thread included
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn()::text")
        row = cursor.fetchone()
        lsn = str(row[0]) if row else "0/0"
        occurrence_bytes = _relation_bytes(cursor, OCCURRENCE_TABLE)
        outbox_bytes = _relation_bytes(cursor, OUTBOX_TABLE)
    names = {name for table in PARTITIONED_TABLES for name in existing_partitions(table).values()}
    return Reading(cpu, lsn, occurrence_bytes, outbox_bytes, names, backend_cpu())


def _wal_bytes(before: str, after: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", [after, before])
        return _one(cursor)


class OutboxDepth(NamedTuple):
    """One sample of the outbox: all rows, those overdue (due more than OVERDUE_S ago: the
    relay's backlog; a sample taken as a minute's strict rows fall due would otherwise count
    a whole minute's rows the relay is publishing that instant), and how long the oldest due
    row has been due (0 when none is: the relay's lateness)."""

    rows: int
    overdue: int
    oldest_due_s: float


def outbox_depth() -> OutboxDepth:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), count(*) FILTER ("
            "WHERE available_at <= now() - make_interval(secs => %s)), "
            "coalesce(extract(epoch FROM now() - min(available_at) FILTER ("
            "WHERE available_at <= now())), 0) "
            "FROM occurrences_dispatchoutbox WHERE parked_at IS NULL",
            [OVERDUE_S],
        )
        row = cursor.fetchone()
    return OutboxDepth(int(row[0]), int(row[1]), float(row[2])) if row else OutboxDepth(0, 0, 0.0)


@dataclass
class MinuteSamples:
    """What was sampled during one minute (from two readings and the outbox samples)."""

    cpu_s: dict[str, float]
    wal_bytes: int
    occurrence_growth_bytes: int
    outbox_growth_bytes: int
    partitions_created: list[str]
    partitions_dropped: list[str]
    outbox_max: int
    outbox_last: int
    due_backlog_max: int
    oldest_due_s_max: float = 0.0


def minute_samples(
    before: Reading, after: Reading, depths: list[OutboxDepth], wal_bytes: int
) -> MinuteSamples:
    return MinuteSamples(
        cpu_s={k: round(v - before.cpu.get(k, 0.0), 2) for k, v in sorted(after.cpu.items())},
        wal_bytes=wal_bytes,
        occurrence_growth_bytes=after.occurrence_bytes - before.occurrence_bytes,
        outbox_growth_bytes=after.outbox_bytes - before.outbox_bytes,
        partitions_created=sorted(after.partitions - before.partitions),
        partitions_dropped=sorted(before.partitions - after.partitions),
        outbox_max=max((d[0] for d in depths), default=0),
        outbox_last=depths[-1][0] if depths else 0,
        due_backlog_max=max((d.overdue for d in depths), default=0),
        oldest_due_s_max=round(max((d.oldest_due_s for d in depths), default=0.0), 2),
    )


# -- the report ----------------------------------------------------------------------------


@dataclass
class MinuteRow:
    minute: str  # ISO start of the minute
    strict: int
    strict_enqueued: int
    strict_p99_s: float | None
    flexible: int
    flexible_enqueued: int
    flexible_p99_s: float | None
    flexible_past_window: int
    early: int
    materialized_late: int
    enqueued: int  # rows (both lanes) enqueued during this minute
    outbox_max: int
    outbox_last: int
    due_backlog_max: int
    cpu_s: dict[str, float]
    wal_bytes: int
    occurrence_growth_bytes: int
    outbox_growth_bytes: int
    partitions_created: list[str]
    partitions_dropped: list[str]
    oldest_due_s_max: float = 0.0


def minute_rows(
    start: datetime, minutes: int, figures: StoredFigures, samples: list[MinuteSamples]
) -> list[MinuteRow]:
    rows = []
    for n in range(minutes):
        minute = start + timedelta(minutes=n)
        lanes = figures.minutes.get(minute, {})
        strict = lanes.get(Lane.STRICT, LaneFigures())
        flexible = lanes.get(Lane.FLEXIBLE, LaneFigures())
        sampled = asdict(samples[n])
        rows.append(
            MinuteRow(
                minute=minute.isoformat(),
                strict=strict.count,
                strict_enqueued=strict.enqueued,
                strict_p99_s=strict.p99_s,
                flexible=flexible.count,
                flexible_enqueued=flexible.enqueued,
                flexible_p99_s=flexible.p99_s,
                flexible_past_window=flexible.past_window,
                early=sum(f.early for f in lanes.values()),
                materialized_late=sum(f.materialized_late for f in lanes.values()),
                enqueued=figures.enqueued_per_minute.get(minute, 0),
                **sampled,
            )
        )
    return rows


def judge(rows: list[MinuteRow], *, missing: int) -> list[str]:
    """Why the run did not hold (empty: it held). Held: every minute's strict rows all
    enqueued with p99 at most HELD_STRICT_P99_S, no flexible row enqueued after its window,
    nothing early, nothing missing, nothing materialized after its instant (the materializer
    kept up), and no outbox row sampled due for longer than HELD_OUTBOX_LATENESS_S (the
    relay kept up)."""
    reasons = []
    for row in rows:
        if row.strict_enqueued < row.strict:
            reasons.append(f"{row.minute}: {row.strict - row.strict_enqueued} strict not enqueued")
        if row.strict_p99_s is not None and row.strict_p99_s > HELD_STRICT_P99_S:
            reasons.append(f"{row.minute}: strict p99 {row.strict_p99_s} s > {HELD_STRICT_P99_S}")
        if row.materialized_late:
            reasons.append(f"{row.minute}: {row.materialized_late} materialized after due")
        if row.flexible_past_window:
            reasons.append(
                f"{row.minute}: {row.flexible_past_window} flexible enqueued after their window"
            )
    early = sum(row.early for row in rows)
    if early:
        reasons.append(f"{early} enqueued early")
    if missing:
        reasons.append(f"{missing} missing (reconcile)")
    for row in rows:
        if row.oldest_due_s_max > HELD_OUTBOX_LATENESS_S:
            reasons.append(
                f"{row.minute}: an outbox row due {row.oldest_due_s_max} s ago "
                f"> {HELD_OUTBOX_LATENESS_S} s (relay behind)"
            )
    return reasons


def start_lag_verdict(p99_s: float | None) -> str:
    """With workers executing, held also needs the start lag's p99 within
    HELD_START_LAG_P99_S; returns why not (empty: within)."""
    if p99_s is not None and p99_s > HELD_START_LAG_P99_S:
        return f"start lag p99 {p99_s} s > {HELD_START_LAG_P99_S} s"
    return ""


@dataclass
class SustainedReport:
    per_minute: int
    minutes: int
    warmup_minutes: int
    flexible_share: float
    tenants: int
    materializers: int
    relays: int
    schedules: int
    start: str
    strict: int
    strict_p99_s: float | None
    worst_minute_strict_p99_s: float | None
    flexible: int
    flexible_p99_s: float | None
    early: int
    not_enqueued: int
    missing: int
    reconcile_counts: dict[str, int]
    consumer_missing: int
    duplicates: int
    consumer_received: int
    cpu_s: dict[str, float]
    wal_bytes: int
    pg_work: PgWork
    profile: Profile
    floor: FloorReport | None
    partitions_created: list[str]
    partitions_dropped: list[str]
    held: bool
    not_held_because: list[str]
    per_minute_rows: list[MinuteRow] = field(default_factory=list)
    execution: ExecutionWork | None = None
    blocks: list[BlockWork] = field(default_factory=list)
    flatness: Flatness | None = None

    def lines(self) -> list[str]:
        out = [
            f"sustained: {self.per_minute:,}/min for {self.minutes} min from {self.start} "
            f"({self.flexible_share:.0%} flexible, window {FLEXIBLE_WINDOW_S} s; "
            f"{self.warmup_minutes} whole min of warm-up), "
            f"{self.schedules:,} schedules of {self.tenants} tenants; "
            f"{self.materializers} materializer(s), {self.relays} relay(s)",
            "  minute  strict  p99 s  flex  p99 s  early  late  enq/min  "
            "outbox(max/overdue/oldest s)  WAL MiB  occ+ MiB  PG µs/occ  WAL KB/occ  cpu s",
        ]
        for row in self.per_minute_rows:
            cpu = " ".join(f"{k}={v}" for k, v in row.cpu_s.items())
            work = BlockWork.of([row], label="")
            out.append(
                f"  {row.minute[11:16]}  {row.strict:>6}  {_s(row.strict_p99_s):>5}  "
                f"{row.flexible:>5}  {_s(row.flexible_p99_s):>5}  {row.early:>5}  "
                f"{row.materialized_late:>4}  {row.enqueued:>7}  "
                f"{row.outbox_max:>7}/{row.due_backlog_max}/{row.oldest_due_s_max:<6}  "
                f"{row.wal_bytes / 2**20:>7.1f}  "
                f"{row.occurrence_growth_bytes / 2**20:>8.1f}  {_n(work.cpu_us):>9}  "
                f"{_n(work.wal_kb, 2):>10}  {cpu}"
            )
        out += [
            f"  strict p99 {_s(self.strict_p99_s)} s (worst minute "
            f"{_s(self.worst_minute_strict_p99_s)} s), flexible p99 {_s(self.flexible_p99_s)} s",
            f"  early {self.early}, not enqueued {self.not_enqueued}, missing {self.missing} "
            f"(reconcile {self.reconcile_counts}), consumer missing {self.consumer_missing}, "
            f"duplicates {self.duplicates}",
            f"  cpu s: {self.cpu_s}; WAL {self.wal_bytes / 2**20:.1f} MiB; partitions "
            f"+{self.partitions_created} -{self.partitions_dropped}",
            f"  held: {self.held}" + (f" ({'; '.join(self.not_held_because)})" if not self.held
                                      else ""),
        ]  # fmt: skip
        out += self.pg_work.lines()
        out += [block.line() for block in self.blocks]
        if self.flatness is not None:
            out += self.flatness.lines()
        if self.execution is not None:
            out += self.execution.lines()
        out += self.profile.lines()
        if self.floor is not None:
            out += self.floor.lines()
        return out


@dataclass
class PgWork:
    """PostgreSQL's work per occurrence enqueued in the measured minutes, and its ratio to the
    lean-SQL floor's delivery path (materialize + relay) on the same server."""

    enqueued: int
    cpu_us: float | None
    wal_bytes: float | None
    wal_fpi: float | None  # full-page images per occurrence (each up to a whole 8 KB page)
    floor_cpu_us: float | None
    floor_wal_bytes: float | None
    cpu_ratio: float | None
    wal_ratio: float | None

    @classmethod
    def of(
        cls, *, cpu_s: float, wal_bytes: int, wal_fpi: int, enqueued: int,
        floor: FloorReport | None,
    ) -> PgWork:  # fmt: skip
        cpu_us = round(cpu_s * 1e6 / enqueued, 1) if enqueued else None
        wal = round(wal_bytes / enqueued) if enqueued else None
        floor_cpu, floor_wal = floor.per_occurrence(DELIVERY_PHASES) if floor else (None, None)
        return cls(
            enqueued=enqueued, cpu_us=cpu_us, wal_bytes=wal,
            wal_fpi=round(wal_fpi / enqueued, 2) if enqueued else None,
            floor_cpu_us=floor_cpu, floor_wal_bytes=floor_wal,
            cpu_ratio=round(cpu_us / floor_cpu, 2) if cpu_us and floor_cpu else None,
            wal_ratio=round(wal / floor_wal, 2) if wal and floor_wal else None,
        )  # fmt: skip

    def lines(self) -> list[str]:
        if self.cpu_us is None or self.wal_bytes is None:
            return ["  PostgreSQL per occurrence: nothing enqueued"]
        line = (
            f"  PostgreSQL per occurrence enqueued ({self.enqueued:,}): {self.cpu_us:.0f} µs CPU, "
            f"{self.wal_bytes / 1024:.2f} KB WAL"
        )
        if self.wal_fpi is not None:
            line += f" ({self.wal_fpi:.2f} full-page images)"
        if self.cpu_ratio is not None and self.wal_ratio is not None:
            line += (
                f"; {self.cpu_ratio:.1f}x CPU and {self.wal_ratio:.1f}x WAL of the lean-SQL "
                f"floor ({self.floor_cpu_us:.0f} µs, {(self.floor_wal_bytes or 0) / 1024:.2f} KB)"
            )
        return [line]


@dataclass
class BlockWork:
    """PostgreSQL's CPU and WAL per occurrence enqueued over some measured minutes, and the
    strict p99 of their worst minute."""

    minutes: str  # "1-5": the block's measured minutes, 1-based
    enqueued: int
    cpu_us: float | None
    wal_kb: float | None
    worst_strict_p99_s: float | None

    @classmethod
    def of(cls, rows: list[MinuteRow], *, label: str) -> BlockWork:
        enqueued = sum(row.enqueued for row in rows)
        cpu_s = sum(row.cpu_s.get("postgresql", 0.0) for row in rows)
        wal = sum(row.wal_bytes for row in rows)
        p99s = [row.strict_p99_s for row in rows if row.strict_p99_s is not None]
        return cls(
            minutes=label, enqueued=enqueued,
            cpu_us=round(cpu_s * 1e6 / enqueued, 1) if enqueued else None,
            wal_kb=round(wal / 1024 / enqueued, 3) if enqueued else None,
            worst_strict_p99_s=max(p99s) if p99s else None,
        )  # fmt: skip

    def line(self) -> str:
        return (
            f"  minutes {self.minutes:>5}: {self.enqueued:>9,} enqueued, PostgreSQL "
            f"{_n(self.cpu_us)} µs CPU and {_n(self.wal_kb, 2)} KB WAL per occurrence, "
            f"worst strict p99 {_s(self.worst_strict_p99_s)} s"
        )


def blocks_of(rows: list[MinuteRow]) -> list[BlockWork]:
    """The measured minutes in blocks of BLOCK_MINUTES (the last one may be shorter); none
    for a run shorter than FLATNESS_MIN_MINUTES."""
    if len(rows) < FLATNESS_MIN_MINUTES:
        return []
    return [
        BlockWork.of(
            rows[n : n + BLOCK_MINUTES], label=f"{n + 1}-{min(n + BLOCK_MINUTES, len(rows))}"
        )
        for n in range(0, len(rows), BLOCK_MINUTES)
    ]


@dataclass
class Flatness:
    """The first BLOCK_MINUTES against the last: the relative change of PostgreSQL's CPU and
    WAL per occurrence, and whether each stayed within FLAT_WITHIN (`flat` is the CPU's)."""

    first: BlockWork
    last: BlockWork
    cpu_change: float | None  # last / first - 1
    wal_change: float | None
    flat: bool
    wal_flat: bool

    def lines(self) -> list[str]:
        return [
            f"  flatness, minutes {self.first.minutes} against {self.last.minutes}: PostgreSQL "
            f"CPU per occurrence {_pct(self.cpu_change)}, WAL {_pct(self.wal_change)} "
            f"(limit ±{FLAT_WITHIN:.0%}): "
            + ("flat" if self.flat else "NOT flat")
            + ("" if self.wal_flat else "; WAL not flat")
        ]


def _change(first: float | None, last: float | None) -> float | None:
    return round(last / first - 1, 3) if first and last is not None else None


def flatness_of(rows: list[MinuteRow]) -> Flatness | None:
    """None for a run shorter than FLATNESS_MIN_MINUTES; a change that cannot be computed
    (nothing enqueued in a block) is not flat."""
    if len(rows) < FLATNESS_MIN_MINUTES:
        return None
    n = len(rows)
    first = BlockWork.of(rows[:BLOCK_MINUTES], label=f"1-{BLOCK_MINUTES}")
    last = BlockWork.of(rows[-BLOCK_MINUTES:], label=f"{n - BLOCK_MINUTES + 1}-{n}")
    cpu = _change(first.cpu_us, last.cpu_us)
    wal = _change(first.wal_kb, last.wal_kb)
    return Flatness(
        first=first, last=last, cpu_change=cpu, wal_change=wal,
        flat=cpu is not None and abs(cpu) <= FLAT_WITHIN,
        wal_flat=wal is not None and abs(wal) <= FLAT_WITHIN,
    )  # fmt: skip


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _n(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.0%}"


def report_json(report: SustainedReport) -> str:
    return json.dumps(asdict(report), sort_keys=True)


# -- the benchmark -------------------------------------------------------------------------


def _reconcile_tenants(
    tenant_ids: list[uuid.UUID], start: datetime, end: datetime
) -> dict[str, int]:
    """Tick's reconciliation audit over [start, end), tenant by tenant, counts summed."""
    counts: dict[str, int] = {}
    for tenant_id in tenant_ids:
        for kind, count in reconcile(start=start, end=end, tenant_id=tenant_id).counts.items():
            counts[kind] = counts.get(kind, 0) + count
    return dict(sorted(counts.items()))


def _check_running(procs: BenchProcesses) -> None:
    if exited := procs.exited():
        raise RuntimeError(f"bench processes exited: {exited} (logs in {procs.logs})")


@dataclass
class RelayStall:
    """The relays stopped (SIGSTOP) `seconds` from `at_minute` measured minutes in, then let
    go on (SIGCONT): a transient stall, and how the relays caught up after it."""

    at_minute: int
    seconds: float
    stopped_at: float | None = None
    resumed_at: float | None = None
    caught_up_after_s: float | None = None
    overdue_max: int = 0
    oldest_due_s_max: float = 0.0

    def tick(self, procs: BenchProcesses, start: datetime, depth: OutboxDepth | None) -> None:
        now = time.monotonic()
        if self.stopped_at is None:
            if timezone.now() >= start + timedelta(minutes=self.at_minute):
                procs.signal_kind("relay", signal.SIGSTOP)
                self.stopped_at = now
            return
        if self.resumed_at is None:
            if now - self.stopped_at >= self.seconds:
                procs.signal_kind("relay", signal.SIGCONT)
                self.resumed_at = now
            return
        if depth is None or self.caught_up_after_s is not None:
            return
        self.overdue_max = max(self.overdue_max, depth.overdue)
        self.oldest_due_s_max = max(self.oldest_due_s_max, depth.oldest_due_s)
        if depth.oldest_due_s <= HELD_OUTBOX_LATENESS_S:
            self.caught_up_after_s = now - self.resumed_at

    def line(self) -> str:
        caught = (
            f"caught up {self.caught_up_after_s:.0f} s after the restart (oldest due row "
            f"<= {HELD_OUTBOX_LATENESS_S:.0f} s)"
            if self.caught_up_after_s is not None
            else "never caught up in the measured window"
        )
        return (
            f"relay stall: relays stopped {self.seconds:.0f} s from minute {self.at_minute}; "
            f"{caught}; after the restart at most {self.overdue_max} overdue rows, the oldest "
            f"due {self.oldest_due_s_max:.0f} s"
        )


def _measure(
    procs: BenchProcesses,
    start: datetime,
    minutes: int,
    say: Callable[[str], object],
    stall: RelayStall | None = None,
) -> tuple[list[MinuteSamples], Profile, dict[str, float]]:
    """Readings at each minute boundary and outbox depth every SAMPLE_EVERY_S between; the
    PostgreSQL profile (pg_profile) of the measured minutes and the CPU of the backends
    serving each process kind over them, sampled with the outbox so that a backend closed
    during the window counts up to its last sample (`backend_cpu_seen`). With a `stall`, the
    relays are stopped and let go on as it says (checked at each sample)."""
    while timezone.now() < start:  # the warm-up
        _check_running(procs)
        time.sleep(min(1.0, max(0.0, (start - timezone.now()).total_seconds())))
    profile_reset()
    before = first = take_reading(procs)
    seen = first.backends
    samples = []
    for n in range(1, minutes + 1):
        boundary = start + timedelta(minutes=n)
        depths = []
        while timezone.now() < boundary:
            depths.append(outbox_depth())
            if stall is not None:
                stall.tick(procs, start, depths[-1])
            seen = backend_cpu_seen(seen, backend_cpu())
            _check_running(procs)
            time.sleep(min(SAMPLE_EVERY_S, max(0.0, (boundary - timezone.now()).total_seconds())))
        after = take_reading(procs)
        if stall is not None:
            say(stall.line())
        samples.append(
            minute_samples(before, after, depths, _wal_bytes(before.wal_lsn, after.wal_lsn))
        )
        say(f"minute {n}/{minutes} done; outbox {depths[-1] if depths else '-'}")
        before = after
        seen = backend_cpu_seen(seen, after.backends)
    opened: dict[str, int] = {}
    for pid, (kind, _) in seen.items():
        if pid not in first.backends:
            opened[kind] = opened.get(kind, 0) + 1
    say(f"backends opened during the window, per kind: {dict(sorted(opened.items()))}")
    return samples, profile_read(), backend_cpu_diff(first.backends, seen)


def _drain(tenant_ids: list[uuid.UUID], start: datetime, end: datetime) -> None:
    """Until every row due in the window is enqueued, or DRAIN_S. Only the last minutes are
    polled (a flexible window and one minute): earlier rows show as not enqueued anyway, and
    a day's window is too large to scan every second."""
    deadline = time.monotonic() + DRAIN_S
    recent = max(start, end - timedelta(seconds=FLEXIBLE_WINDOW_S + 60))
    params = _window_params(tenant_ids, recent, end)
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT count(*) FROM ({_WINDOW_ROWS}) w WHERE w.enqueued_at IS NULL", params
            )
            if _one(cursor) == 0:
                break
        time.sleep(1.0)
    time.sleep(2.0)  # let the consumer take the last messages (and late duplicates, if any)


def _drain_execution(tenant_ids: list[uuid.UUID], start: datetime, end: datetime) -> None:
    """Until every row of the window is finished (executed), or DRAIN_S."""
    deadline = time.monotonic() + DRAIN_S
    lo = start - timedelta(seconds=FLEXIBLE_WINDOW_S)
    while time.monotonic() < deadline and unfinished_count(tenant_ids, start, end, lo=lo):
        time.sleep(1.0)


@dataclass(frozen=True)
class WorkerPlan:
    """W Celery workers of C slots executing every occurrence (`noop`); 0 workers: an
    independent consumer takes the messages instead (delivery only). `bare_tasks` tasks of
    bare Celery afterwards, over `bare_s` seconds (0: no bare floor)."""

    workers: int = 0
    concurrency: int = 2
    bare_tasks: int = 0
    bare_s: float = 60.0


def bench_sustained(
    *,
    per_minute: int,
    minutes: int,
    flexible_share: float = 0.5,
    tenants: int = 100,
    materializers: int = 2,
    relays: int = 2,
    lead_s: float = 90.0,
    warmup_minutes: int = 0,
    floor: bool = True,
    execution: WorkerPlan | None = None,
    relay_stall: tuple[int, float] | None = None,
    log: Callable[[str], object] | None = None,
) -> SustainedReport:
    say = log or (lambda message: None)
    execution = execution or WorkerPlan()
    executing = execution.workers > 0
    # Before anything else runs: the floor's figures are this server's, unloaded.
    floor_report = bench_floor(log=say) if floor else None
    plan = SpreadPlan(per_minute, flexible_share, tenants)
    prefix = f"tick-bench-{uuid.uuid4().hex[:8]}"
    broker_url = settings.CELERY_BROKER_URL
    tenant_ids = bench_tenants(prefix, tenants)
    logs = Path(tempfile.mkdtemp(prefix="tick-bench-"))
    procs = BenchProcesses(prefix, logs)
    queues = all_queue_names(prefix, settings.TICK_TENANT_PARTITIONS)
    consumer = IdConsumer(broker_url, queues, logs / "received.txt")
    try:
        first = next_whole_minute(timezone.now(), lead_s)
        # Flexible rows reach a steady rate per minute of available_at only one window
        # after the first instant: `warmup_minutes` 5 measures from there.
        start = first + timedelta(minutes=warmup_minutes)
        handler = EXECUTION_HANDLER if executing else BENCH_HANDLER
        _load_schedules(plan, tenant_ids, first, say, handler)
        if timezone.now() > first - timedelta(seconds=15):
            raise RuntimeError("loading ended too close to the first instant: raise the lead")
        declare_topology(broker_url, prefix)
        if executing:
            procs.start_workers(execution.workers, execution.concurrency)
        else:
            consumer.start()
            consumer.ready.wait(10)
        for command, count in zip(PIPELINE_COMMANDS, (materializers, relays), strict=True):
            procs.start_command(command, count)
        say(
            f"{materializers} materializer(s), {relays} relay(s), {execution.workers} "
            f"worker(s) started (logs in {logs}); measuring {minutes} min from "
            f"{start.isoformat()}"
        )
        end = start + timedelta(minutes=minutes)
        stall = RelayStall(*relay_stall) if relay_stall else None
        samples, profile, backends = _measure(procs, start, minutes, say, stall)
        if executing:
            _drain_execution(tenant_ids, start, end)
        else:
            _drain(tenant_ids, start, end)
        procs.stop()
        consumer.stop()
        bare = None
        if executing and execution.bare_tasks:
            bare = bare_celery_floor(
                broker_url=broker_url, logs=logs, workers=execution.workers,
                concurrency=execution.concurrency, tasks=execution.bare_tasks,
                seconds=execution.bare_s, say=say,
            )  # fmt: skip
        say("reconciling…")
        counts = _reconcile_tenants(tenant_ids, start, end)
        consumer_missing, duplicates = (
            (0, 0) if executing else consumer_check(tenant_ids, start, end, consumer.path)
        )
        figures = stored_figures(tenant_ids, start, end)
        report = _report(
            plan, figures, samples, start=start, minutes=minutes, warmup_minutes=warmup_minutes,
            materializers=materializers,
            relays=relays, counts=counts, consumer_missing=consumer_missing,
            duplicates=duplicates, received=consumer.received_count, profile=profile,
            floor=floor_report,
        )  # fmt: skip
        if executing:
            report.execution = _execution_work(
                execution, tenant_ids, start, end, minutes=minutes, report=report,
                backends=backends, bare=bare,
            )  # fmt: skip
            late = start_lag_verdict(report.execution.stored.start_lag_p99_s)
            if late:
                report.not_held_because.append(late)
                report.held = False
        return report
    finally:
        procs.stop()
        consumer.stop()
        say("cleaning up…")
        bench_tenants_delete(tenant_ids)
        delete_topology(broker_url, prefix)
        (logs / "received.txt").unlink(missing_ok=True)


def _execution_work(
    execution: WorkerPlan, tenant_ids: list[uuid.UUID], start: datetime, end: datetime, *,
    minutes: int, report: SustainedReport, backends: dict[str, float],
    bare: BareCeleryFloor | None,
) -> ExecutionWork:  # fmt: skip
    stored = stored_execution(
        tenant_ids, start, end, lo=start - timedelta(seconds=FLEXIBLE_WINDOW_S)
    )
    return ExecutionWork.of(
        workers=execution.workers, concurrency=execution.concurrency, stored=stored,
        minutes=minutes, backend_cpu_s=backends, cpu_s=report.cpu_s, profile=report.profile,
        bare=bare,
    )  # fmt: skip


def _report(
    plan: SpreadPlan,
    figures: StoredFigures,
    samples: list[MinuteSamples],
    *,
    start: datetime,
    minutes: int,
    warmup_minutes: int,
    materializers: int,
    relays: int,
    counts: dict[str, int],
    consumer_missing: int,
    duplicates: int,
    received: int,
    profile: Profile,
    floor: FloorReport | None,
) -> SustainedReport:
    rows = minute_rows(start, minutes, figures, samples)
    strict = figures.overall.get(Lane.STRICT, LaneFigures())
    flexible = figures.overall.get(Lane.FLEXIBLE, LaneFigures())
    every = list(figures.overall.values())
    missing = counts.get("missing", 0)
    reasons = judge(rows, missing=missing)
    for kind in ("unexpected", "stranded"):
        if counts.get(kind):
            reasons.append(f"{counts[kind]} {kind} (reconcile)")
    if consumer_missing:
        reasons.append(f"{consumer_missing} enqueued but never received")
    cpu: dict[str, float] = {}
    for sample in samples:
        for kind, seconds in sample.cpu_s.items():
            cpu[kind] = round(cpu.get(kind, 0.0) + seconds, 2)
    p99s = [row.strict_p99_s for row in rows if row.strict_p99_s is not None]
    wal_bytes = sum(s.wal_bytes for s in samples)
    work = PgWork.of(
        cpu_s=cpu.get("postgresql", 0.0), wal_bytes=wal_bytes, wal_fpi=profile.wal.fpi,
        enqueued=sum(row.enqueued for row in rows), floor=floor,
    )  # fmt: skip
    return SustainedReport(
        per_minute=plan.per_minute,
        minutes=minutes,
        warmup_minutes=warmup_minutes,
        flexible_share=plan.flexible_share,
        tenants=plan.tenants,
        materializers=materializers,
        relays=relays,
        schedules=plan.schedule_count,
        start=start.isoformat(),
        strict=strict.count,
        strict_p99_s=strict.p99_s,
        worst_minute_strict_p99_s=max(p99s) if p99s else None,
        flexible=flexible.count,
        flexible_p99_s=flexible.p99_s,
        early=sum(f.early for f in every),
        not_enqueued=sum(f.count - f.enqueued for f in every),
        missing=missing,
        reconcile_counts=counts,
        consumer_missing=consumer_missing,
        duplicates=duplicates,
        consumer_received=received,
        cpu_s=cpu,
        wal_bytes=wal_bytes,
        pg_work=work,
        profile=profile,
        floor=floor,
        partitions_created=sorted({n for s in samples for n in s.partitions_created}),
        partitions_dropped=sorted({n for s in samples for n in s.partitions_dropped}),
        held=not reasons,
        not_held_because=reasons,
        per_minute_rows=rows,
        blocks=blocks_of(rows),
        flatness=flatness_of(rows),
    )
