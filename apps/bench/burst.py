"""Burst benchmark of the delivery path (wrapped by `manage.py bench_burst`).

N strict (or flexible) schedules of T tenants — one tenant owning 90 % — all come due at one
instant a little ahead. Real `manage.py materialize` and `manage.py relay` processes do the
work against the real PostgreSQL and RabbitMQ, on a private queue prefix; an independent
consumer (a thread here, on its own AMQP connection) records each occurrence's arrival.
Reported: lag `enqueued_at - scheduled_for` (flexible: `- available_at`) from the database,
the consumer's arrival lag, missing and duplicate occurrences, throughput, the small
tenants' p99, CPU seconds and peak RSS per process kind. Everything is removed afterwards.

Setup writes schedules with COPY (`bench.fixtures`) but computes every server-owned field with
Tick's own code (`shard_for`) and writes what the create service writes with each schedule (a
version-1 row and a `created` event), so the rows are what `schedule_create` would have
produced.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import connection
from django.db.models import QuerySet
from django.utils import timezone

from apps.bench.bulk_load import load_not_due_schedules
from apps.bench.consumer import OccurrenceConsumer
from apps.bench.fixtures import (
    ScheduleBatch,
    bench_tenants,
    bench_tenants_delete,
    cron_definition,
    next_whole_minute,
)
from apps.bench.processes import (
    BenchProcesses,
    declare_topology,
    delete_topology,
    services_cpu,
)
from apps.bench.sizes import (
    GROWING_TABLES,
    due_scan_plan,
    index_sizes,
    relation_sizes,
)
from apps.occurrences.models import Occurrence
from apps.occurrences.pipeline.queues import all_queue_names
from apps.schedules.models import Schedule

# The pipeline processes the bench starts: `manage.py` command names, which also key the
# report's cpu and peak_rss_mb figures.
PIPELINE_COMMANDS = ("materialize", "relay")


@dataclass(frozen=True)
class _Burst:
    """One run: N schedules of the tenants (the first owns 90 %) due at one instant."""

    tenant_ids: list[uuid.UUID]
    instant: datetime
    schedules: int
    precision: Schedule.Precision
    flexible_window_s: int
    extra_active: int


@dataclass
class BurstReport:
    schedules: int
    tenants: int
    materializers: int
    relays: int
    precision: str
    flexible_window_s: int
    extra_active: int
    materialized_before_instant: bool
    p50_s: float
    p95_s: float
    p99_s: float
    max_s: float
    consumer_p99_s: float
    missing: int
    consumer_missing: int
    duplicates: int
    early: int
    throughput_per_s: float
    small_tenants_p99_s: float
    big_tenant_p99_s: float
    spread_s: float
    materialize_s: float
    cpu: dict[str, float] = field(default_factory=dict)
    peak_rss_mb: dict[str, float] = field(default_factory=dict)
    # With extra active schedules: their load time, what the database holds, the due scan.
    extra_load_s: float = 0.0
    sizes: dict[str, dict[str, float]] = field(default_factory=dict)
    schedule_index_mib: dict[str, float] = field(default_factory=dict)
    due_scan_plan: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [
            f"burst: {self.schedules:,} {self.precision.lower()} occurrences at one instant, "
            f"{self.tenants} tenants (one owns 90 %), {self.extra_active:,} extra active; "
            f"{self.materializers} materializer(s), {self.relays} relay(s)",
            f"  materialized in {self.materialize_s:.1f} s, before the instant: "
            f"{self.materialized_before_instant}",
            f"  lag (db): p50 {self.p50_s:.3f} s  p95 {self.p95_s:.3f} s  p99 {self.p99_s:.3f} s"
            f"  max {self.max_s:.3f} s;  consumer p99 {self.consumer_p99_s:.3f} s",
            f"  small tenants p99 {self.small_tenants_p99_s:.3f} s, big tenant p99 "
            f"{self.big_tenant_p99_s:.3f} s;  throughput {self.throughput_per_s:,.0f}/s",
            f"  missing {self.missing} (consumer {self.consumer_missing}), duplicates "
            f"{self.duplicates}, early {self.early}, spread {self.spread_s:.1f} s",
            f"  cpu s: {self.cpu}",
            f"  peak rss MiB: {self.peak_rss_mb}",
            *self._database_lines(),
        ]

    def _database_lines(self) -> list[str]:
        if not self.sizes:
            return []
        return [
            f"  extra active loaded in {self.extra_load_s:.0f} s; sizes: {self.sizes}",
            f"  schedule indexes MiB: {self.schedule_index_mib}",
            "  due scan:",
            *(f"    {line}" for line in self.due_scan_plan),
        ]


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- setup ---------------------------------------------------------------------------------


def _copy_schedules(
    tenant_ids: list[uuid.UUID],
    weights: list[int],
    count: int,
    *,
    expression: str,
    next_run_at: datetime,
    precision: Schedule.Precision,
    window_s: int,
) -> None:
    """COPY `count` cron schedules (and their version-1 rows) spread over the tenants."""
    now = timezone.now()
    owners: list[uuid.UUID] = []
    for tenant_id, weight in zip(tenant_ids, weights, strict=True):
        owners.extend([tenant_id] * weight)
    definition = cron_definition(expression, precision=precision, window_s=window_s)
    chunk = 50_000
    with connection.cursor() as cursor:
        for start in range(0, count, chunk):
            batch = ScheduleBatch()
            for n in range(start, min(count, start + chunk)):
                sid = uuid.uuid4()
                tenant = owners[n % len(owners)]
                batch.add_schedule(
                    sid, tenant, expression=expression, time_zone="UTC", precision=precision,
                    flexible_window_s=window_s, next_run_at=next_run_at, created_at=now,
                    definition=definition,
                )  # fmt: skip
                batch.add_created_event(sid, tenant, now)
            batch.copy(cursor)


def _owner_weights(tenant_ids: list[uuid.UUID]) -> list[int]:
    """One tenant owns 90 %; the rest share 10 %."""
    small = tenant_ids[1:]
    return [9 * max(1, len(small))] + [1] * len(small) if small else [1]


def _load_extra_active(
    tenant_ids: list[uuid.UUID], weights: list[int], count: int, say: Callable[[str], object]
) -> None:
    say(f"loading {count:,} extra active schedules (due next year)…")
    expression = "0 0 1 1 *"
    load_not_due_schedules(
        tenant_ids, weights, count, expression=expression,
        next_run_at=datetime(timezone.now().year + 1, 1, 1, tzinfo=UTC),
        definition=cron_definition(
            expression, precision=Schedule.Precision.STRICT, window_s=0
        ),
        say=say,
    )  # fmt: skip


def _load_due(burst: _Burst, weights: list[int], say: Callable[[str], object]) -> None:
    """COPY the burst's schedules, all due at its instant, and refresh the planner's stats."""
    instant = burst.instant
    say(f"loading {burst.schedules:,} schedules due at {instant.isoformat()}…")
    _copy_schedules(
        burst.tenant_ids, weights, burst.schedules,
        expression=f"{instant.minute} {instant.hour} {instant.day} {instant.month} *",
        next_run_at=instant, precision=burst.precision, window_s=burst.flexible_window_s,
    )  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE schedules_schedule")


# -- processes -----------------------------------------------------------------------------


class _Consumer(OccurrenceConsumer):
    """Records every arrival of each occurrence (duplicates included)."""

    def __init__(self, broker_url: str, queues: list[str]) -> None:
        super().__init__(broker_url, queues)
        self.arrivals: dict[str, list[float]] = {}

    def received(self, occurrence_id: str, arrived: float) -> None:
        self.arrivals.setdefault(occurrence_id, []).append(arrived)


def _burst_occurrences(burst: _Burst) -> QuerySet[Occurrence]:
    return Occurrence.objects.filter(tenant_id__in=burst.tenant_ids, scheduled_for=burst.instant)


# Whether any schedule of the burst still waits to be materialized: the advance of
# `next_run_at` commits with the occurrences, so none left means all are stored. One probe
# per shard of schedule_due_idx, however many other schedules exist.
_UNMATERIALIZED = f"""
    SELECT 1 FROM schedules_schedule
    WHERE state = '{Schedule.State.ACTIVE.value}' AND next_run_at IS NOT NULL
      AND shard = ANY(%s) AND next_run_at = %s AND tenant_id = ANY(%s)
    LIMIT 1
"""


def _wait_materialized(burst: _Burst, timeout_s: float) -> datetime:
    """When every occurrence of the burst was stored; raises after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    shards = list(range(settings.TICK_SHARDS))
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(_UNMATERIALIZED, [shards, burst.instant, burst.tenant_ids])
            if cursor.fetchone() is None:
                return timezone.now()
            time.sleep(0.25)
    raise RuntimeError("materialization did not finish in time")


def _wait_delivered(burst: _Burst, consumer: _Consumer, deadline: datetime) -> None:
    """Until every occurrence is enqueued and has reached the consumer, or `deadline`."""
    enqueued = _burst_occurrences(burst).filter(enqueued_at__isnull=False)
    while timezone.now() < deadline:
        if enqueued.count() >= burst.schedules and len(consumer.arrivals) >= burst.schedules:
            break
        time.sleep(0.5)
    time.sleep(1.0)  # let late duplicates, if any, arrive


# -- the benchmark -------------------------------------------------------------------------


def bench_burst(
    *,
    schedules: int,
    tenants: int,
    flexible_window_s: int = 0,
    extra_active: int = 0,
    lead_s: float = 60.0,
    timeout_s: float = 120.0,
    materializers: int = 1,
    relays: int = 1,
    log: Callable[[str], object] | None = None,
    on_started: Callable[[datetime], object] | None = None,
    on_delivered: Callable[[], object] | None = None,
    keep: bool = False,
) -> BurstReport:
    """`on_started(instant)` is called once the pipeline processes run, `on_delivered()` once
    the burst is delivered (or timed out), before the report and the cleanup: a caller
    measuring something else during the burst (`bench.api_load`) times itself by them.
    `keep` leaves every row in place (a scratch database: deleting 20M rows takes longer
    than loading them)."""
    say = log or (lambda message: None)
    prefix = f"tick-bench-{uuid.uuid4().hex[:8]}"
    broker_url = settings.CELERY_BROKER_URL
    tenant_ids = bench_tenants(prefix, tenants)
    weights = _owner_weights(tenant_ids)
    logs = Path(tempfile.mkdtemp(prefix="tick-bench-"))
    procs = BenchProcesses(prefix, logs)
    consumer = _Consumer(broker_url, all_queue_names(prefix, settings.TICK_TENANT_PARTITIONS))
    try:
        loading = time.monotonic()
        if extra_active:
            _load_extra_active(tenant_ids, weights, extra_active, say)
        extra_load_s = time.monotonic() - loading
        now = timezone.now()
        burst = _Burst(
            tenant_ids=tenant_ids,
            instant=next_whole_minute(now, lead_s),
            schedules=schedules,
            precision=(
                Schedule.Precision.FLEXIBLE if flexible_window_s else Schedule.Precision.STRICT
            ),
            flexible_window_s=flexible_window_s,
            extra_active=extra_active,
        )
        _load_due(burst, weights, say)
        declare_topology(broker_url, prefix)
        consumer.start()
        consumer.ready.wait(10)
        say(f"process logs in {logs}")
        services_before = services_cpu()
        started_at = timezone.now()
        for command, count in zip(PIPELINE_COMMANDS, (materializers, relays), strict=True):
            procs.start_command(command, count)
        say(
            f"{materializers} materializer(s) and {relays} relay(s) started; "
            f"instant in {(burst.instant - now).total_seconds():.0f} s"
        )
        if on_started is not None:
            on_started(burst.instant)
        materialized_at = _wait_materialized(burst, timeout_s + lead_s)
        _wait_delivered(
            burst, consumer, burst.instant + timedelta(seconds=timeout_s + flexible_window_s)
        )
        if on_delivered is not None:
            on_delivered()
        cpu, rss = procs.usage(services_before, own_kind="bench+consumer")
        report = _report(
            burst, consumer.arrivals, materializers=materializers, relays=relays,
            materialized_before_instant=materialized_at < burst.instant,
            materialize_s=(materialized_at - started_at).total_seconds(), cpu=cpu, rss=rss,
        )  # fmt: skip
        if extra_active:
            _add_database_figures(report, extra_load_s)
        return report
    finally:
        procs.stop()
        consumer.stop()
        if keep:
            say(f"rows left in place (tenants {', '.join(str(t) for t in tenant_ids)})")
        else:
            say("cleaning up…")
            bench_tenants_delete(tenant_ids)
        delete_topology(broker_url, prefix)


def _add_database_figures(report: BurstReport, extra_load_s: float) -> None:
    with connection.cursor() as cursor:
        for table in GROWING_TABLES:
            cursor.execute(f"ANALYZE {table}")
    report.extra_load_s = round(extra_load_s, 1)
    report.sizes = relation_sizes()
    report.schedule_index_mib = index_sizes("schedules_schedule")
    report.due_scan_plan = due_scan_plan()


# -- the report ----------------------------------------------------------------------------


@dataclass
class _Lags:
    """Seconds from each enqueued occurrence's reference instant to its enqueue."""

    last_enqueued: datetime  # the latest enqueue; the instant while there is none
    overall: list[float] = field(default_factory=list)
    by_tenant: dict[uuid.UUID, list[float]] = field(default_factory=dict)
    at_consumer: list[float] = field(default_factory=list)  # to its first arrival instead
    early: int = 0


_Row = tuple[str, uuid.UUID, datetime, datetime, datetime | None]


def _occurrence_rows(burst: _Burst) -> list[_Row]:
    """(id as text, tenant, scheduled_for, available_at, enqueued_at) of the burst."""
    rows = _burst_occurrences(burst).values_list(
        "id", "tenant_id", "scheduled_for", "available_at", "enqueued_at"
    )
    return [
        (str(occ_id), tenant_id, scheduled_for, available_at, enqueued_at)
        for occ_id, tenant_id, scheduled_for, available_at, enqueued_at in rows
    ]


def _measure_lags(burst: _Burst, rows: list[_Row], arrivals: dict[str, list[float]]) -> _Lags:
    """Lags from `available_at` (flexible) or `scheduled_for` (strict); unenqueued skipped."""
    lags = _Lags(last_enqueued=burst.instant)
    flexible = burst.precision == Schedule.Precision.FLEXIBLE
    for occ_id, tenant_id, scheduled_for, available_at, enqueued_at in rows:
        reference = available_at if flexible else scheduled_for
        if enqueued_at is None:
            continue
        lag = (enqueued_at - reference).total_seconds()
        lags.early += lag < 0
        lags.overall.append(lag)
        lags.by_tenant.setdefault(tenant_id, []).append(lag)
        lags.last_enqueued = max(lags.last_enqueued, enqueued_at)
        if arrivals.get(occ_id):
            lags.at_consumer.append(min(arrivals[occ_id]) - reference.timestamp())
    return lags


def _report(
    burst: _Burst,
    arrivals: dict[str, list[float]],
    *,
    materializers: int,
    relays: int,
    materialized_before_instant: bool,
    materialize_s: float,
    cpu: dict[str, float],
    rss: dict[str, float],
) -> BurstReport:
    rows = _occurrence_rows(burst)
    lags = _measure_lags(burst, rows, arrivals)
    big = burst.tenant_ids[0]
    small = [lag for tenant, values in lags.by_tenant.items() if tenant != big for lag in values]
    spread = [(a - s).total_seconds() for _, _, s, a, _ in rows]  # available_at - scheduled_for
    stored = {row[0] for row in rows}
    duplicates = sum(len(v) - 1 for k, v in arrivals.items() if k in stored)
    window = max((lags.last_enqueued - burst.instant).total_seconds(), 1e-3)
    return BurstReport(
        schedules=burst.schedules,
        tenants=len(burst.tenant_ids),
        materializers=materializers,
        relays=relays,
        precision=str(burst.precision),
        flexible_window_s=burst.flexible_window_s,
        extra_active=burst.extra_active,
        materialized_before_instant=materialized_before_instant,
        p50_s=round(statistics.median(lags.overall), 3) if lags.overall else float("nan"),
        p95_s=round(_quantile(lags.overall, 0.95), 3),
        p99_s=round(_quantile(lags.overall, 0.99), 3),
        max_s=round(max(lags.overall), 3) if lags.overall else float("nan"),
        consumer_p99_s=round(_quantile(lags.at_consumer, 0.99), 3),
        missing=burst.schedules - len(lags.overall),
        consumer_missing=burst.schedules - sum(1 for k in stored if k in arrivals),
        duplicates=duplicates,
        early=lags.early,
        throughput_per_s=round(len(lags.overall) / window, 1),
        small_tenants_p99_s=round(_quantile(small, 0.99), 3),
        big_tenant_p99_s=round(_quantile(lags.by_tenant.get(big, []), 0.99), 3),
        spread_s=round(max(spread) - min(spread), 1) if spread else 0.0,
        materialize_s=round(materialize_s, 2),
        cpu={k: round(v, 2) for k, v in cpu.items()},
        peak_rss_mb={k: round(v, 1) for k, v in rss.items()},
    )


def report_json(report: BurstReport) -> str:
    return json.dumps(asdict(report), sort_keys=True)
