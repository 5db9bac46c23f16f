"""Burst benchmark of the delivery path (wrapped by `manage.py bench_burst`).

N strict (or flexible) schedules of T tenants — one tenant owning 90 % — all come due at one
instant a little ahead. Real `manage.py materialize` and `manage.py relay` processes do the
work against the real PostgreSQL and RabbitMQ, on a private queue prefix; an independent
consumer (a thread here, on its own AMQP connection) records each occurrence's arrival.
Reported: lag `enqueued_at - scheduled_for` (flexible: `- available_at`) from the database,
the consumer's arrival lag, missing and duplicate occurrences, throughput, the small
tenants' p99, CPU seconds and peak RSS per process kind. Everything is removed afterwards.

Setup writes schedules with COPY but computes every server-owned field with Tick's own code
(`shard_for`) and writes what the create service writes with each schedule (a version-1 row
and a `created` event), so the rows are what `schedule_create` would have produced.
"""

from __future__ import annotations

import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from apps.occurrences.pipeline.queues import all_queue_names
from apps.schedules.models import shard_for
from apps.tenants.models import Tenant
from apps.tenants.services import tenant_create

ROOT = Path(__file__).resolve().parents[2]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class BurstReport:
    schedules: int
    tenants: int
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

    def lines(self) -> list[str]:
        return [
            f"burst: {self.schedules:,} {self.precision.lower()} occurrences at one instant, "
            f"{self.tenants} tenants (one owns 90 %), {self.extra_active:,} extra active",
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
    precision: str,
    window_s: int,
) -> None:
    """COPY `count` cron schedules (and their version-1 rows) spread over the tenants."""
    now = timezone.now()
    owners: list[uuid.UUID] = []
    for tenant_id, weight in zip(tenant_ids, weights, strict=True):
        owners.extend([tenant_id] * weight)
    definition = json.dumps(
        {"kind": "CRON", "expression": expression, "time_zone": "UTC", "precision": precision,
         "flexible_window_s": window_s, "handler": "record"}
    )  # fmt: skip
    chunk = 50_000
    with connection.cursor() as cursor:
        for start in range(0, count, chunk):
            schedules, versions, events = io.StringIO(), io.StringIO(), io.StringIO()
            for n in range(start, min(count, start + chunk)):
                sid = uuid.uuid4()
                tenant = owners[n % len(owners)]
                schedules.write(
                    f"{sid}\t{tenant}\tbench\tCRON\t{expression}\tUTC\tskip\tfirst\t{precision}\t"
                    f"{window_s}\tFIRE_ONCE\t60\t0\tALLOW\trecord\t{{}}\t1\tACTIVE\t"
                    f"{next_run_at.isoformat()}\t{shard_for(sid, settings.TICK_SHARDS)}\t"
                    f"{now.isoformat()}\t{now.isoformat()}\n"
                )
                versions.write(f"{sid}\t{tenant}\t1\t{definition}\t{now.isoformat()}\n")
                events.write(f"{sid}\t{tenant}\tcreated\t1\tbench\t{now.isoformat()}\t{{}}\n")
            raw = cursor.cursor  # psycopg's cursor: COPY is its own protocol
            with raw.copy(
                "COPY schedules_schedule (id, tenant_id, name, kind, expression, time_zone, "
                "dst_gap, dst_fold, precision, flexible_window_s, misfire_policy, "
                "max_lateness_s, catchup_limit, overlap_policy, handler, payload, version, "
                "state, next_run_at, shard, created_at, updated_at) FROM STDIN"
            ) as copy:
                copy.write(schedules.getvalue())
            with raw.copy(
                "COPY schedules_scheduleversion (schedule_id, tenant_id, version, definition, "
                "valid_from) FROM STDIN"
            ) as copy:
                copy.write(versions.getvalue())
            with raw.copy(
                "COPY schedules_scheduleevent (schedule_id, tenant_id, kind, version, actor, "
                "at, detail) FROM STDIN"
            ) as copy:
                copy.write(events.getvalue())


def _cleanup(tenant_ids: list[uuid.UUID]) -> None:
    with connection.cursor() as cursor:
        for table in (
            "occurrences_dispatchoutbox",
            "occurrences_attempt",
            "occurrences_occurrence",
            "schedules_scheduleevent",
            "schedules_scheduleversion",
            "schedules_schedule",
            "tenants_tenant",
        ):
            column = "id" if table == "tenants_tenant" else "tenant_id"
            cursor.execute(f"DELETE FROM {table} WHERE {column} = ANY(%s)", [tenant_ids])


# -- processes -----------------------------------------------------------------------------


def _proc_cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def _proc_peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _pids_named(*names: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm = (entry / "comm").read_text().strip()
            except OSError:
                continue
            if comm in names:
                pids.append(int(entry.name))
    return pids


def _services_cpu() -> dict[str, float]:
    return {
        "postgresql": sum(_proc_cpu_s(p) for p in _pids_named("postgres", "postmaster")),
        "rabbitmq": sum(_proc_cpu_s(p) for p in _pids_named("beam.smp")),
    }


class _Consumer(threading.Thread):
    """Independent consumer: its own AMQP connection; records every occurrence it receives."""

    def __init__(self, broker_url: str, queues: list[str]) -> None:
        super().__init__(name="bench-consumer", daemon=True)
        self.queues = queues
        self.broker_url = broker_url
        self.arrivals: dict[str, list[float]] = {}
        self.stop = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        from apps.occurrences.pipeline.broker import connect_any

        conn, _ = connect_any(self.broker_url)
        channel = conn.channel()
        channel.basic_qos(0, 1000, False)

        def on_message(message: Any) -> None:
            arrived = time.time()
            _args, kwargs, _embed = json.loads(message.body)
            items = kwargs.get("occurrences") or [kwargs]
            for item in items:
                self.arrivals.setdefault(item["occurrence_id"], []).append(arrived)
            channel.basic_ack(message.delivery_tag)

        for queue in self.queues:
            channel.basic_consume(queue, callback=on_message)
        self.ready.set()
        while not self.stop.is_set():
            try:
                conn.drain_events(timeout=0.2)
            except TimeoutError:
                pass
        conn.close()


def _publisher(broker_url: str, prefix: str) -> Any:
    from apps.occurrences.pipeline.broker import Publisher

    return Publisher(
        broker_url, prefix=prefix, partitions=settings.TICK_TENANT_PARTITIONS, celery_app=None
    )


# -- the benchmark -------------------------------------------------------------------------


def bench_burst(
    *,
    schedules: int,
    tenants: int,
    flexible_window_s: int = 0,
    extra_active: int = 0,
    lead_s: float = 60.0,
    timeout_s: float = 120.0,
    log: Any = None,
) -> BurstReport:
    say = log or (lambda message: None)
    prefix = f"tick-bench-{uuid.uuid4().hex[:8]}"
    broker_url = settings.CELERY_BROKER_URL
    tenant_ids = [tenant_create(slug=f"bench-{prefix[-8:]}-{i}").id for i in range(tenants)]
    # The benchmark measures Tick's capacity, not a tenant's quota: lift the rate quotas.
    Tenant.objects.filter(id__in=tenant_ids).update(
        trigger_rate_per_s=10_000_000, catchup_rate_per_s=10_000_000
    )
    big, small = tenant_ids[0], tenant_ids[1:]
    # One tenant owns 90 %; the rest share 10 %.
    weights = [9 * max(1, len(small))] + [1] * len(small) if small else [1]
    precision = "FLEXIBLE" if flexible_window_s else "STRICT"
    procs: dict[str, subprocess.Popen[bytes]] = {}
    consumer = _Consumer(broker_url, all_queue_names(prefix, settings.TICK_TENANT_PARTITIONS))
    try:
        if extra_active:
            say(f"loading {extra_active:,} extra active schedules (due next year)…")
            _copy_schedules(
                tenant_ids, weights, extra_active, expression="0 0 1 1 *",
                next_run_at=datetime(timezone.now().year + 1, 1, 1, tzinfo=UTC),
                precision="STRICT", window_s=0,
            )  # fmt: skip
        now = timezone.now()
        instant = (now + timedelta(seconds=lead_s)).replace(second=0, microsecond=0)
        if instant < now + timedelta(seconds=lead_s):
            instant += timedelta(minutes=1)
        say(f"loading {schedules:,} schedules due at {instant.isoformat()}…")
        _copy_schedules(
            tenant_ids, weights, schedules,
            expression=f"{instant.minute} {instant.hour} {instant.day} {instant.month} *",
            next_run_at=instant, precision=precision, window_s=flexible_window_s,
        )  # fmt: skip
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE schedules_schedule")
        declarer = _publisher(broker_url, prefix)
        declarer.connect()  # declares the topology the relay will publish to
        declarer.close()
        consumer.start()
        consumer.ready.wait(10)
        env = {**os.environ, "TICK_QUEUE_PREFIX": prefix, "PYTHONUNBUFFERED": "1"}
        logs = Path(tempfile.mkdtemp(prefix="tick-bench-"))
        say(f"process logs in {logs}")
        services_before = _services_cpu()
        started_at = timezone.now()
        for kind in ("materialize", "relay"):
            procs[kind] = subprocess.Popen(  # noqa: S603 - fixed argv: this interpreter, manage.py
                [sys.executable, "manage.py", kind], cwd=ROOT, env=env,
                stdout=subprocess.DEVNULL, stderr=(logs / f"{kind}.log").open("wb"),
            )  # fmt: skip
        say(f"materializer and relay started; instant in {(instant - now).total_seconds():.0f} s")
        materialized_at = _wait_materialized(tenant_ids, schedules, instant, timeout_s + lead_s)
        materialize_s = (materialized_at - started_at).total_seconds()
        deadline = instant + timedelta(seconds=timeout_s + flexible_window_s)
        while timezone.now() < deadline:
            if _enqueued(tenant_ids, instant) >= schedules and len(consumer.arrivals) >= schedules:
                break
            time.sleep(0.5)
        time.sleep(1.0)  # let late duplicates, if any, arrive
        cpu = {kind: _proc_cpu_s(p.pid) for kind, p in procs.items()}
        rss = {kind: _proc_peak_rss_mb(p.pid) for kind, p in procs.items()}
        services_after = _services_cpu()
        for name, before in services_before.items():
            cpu[name] = services_after[name] - before
        cpu["bench+consumer"] = _proc_cpu_s(os.getpid())
        rss["bench+consumer"] = _proc_peak_rss_mb(os.getpid())
        return _report(
            tenant_ids, big, instant, schedules, precision, flexible_window_s, extra_active,
            consumer, materialized_at < instant, materialize_s, cpu, rss,
        )  # fmt: skip
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        consumer.stop.set()
        if consumer.is_alive():
            consumer.join(5)
        say("cleaning up…")
        _cleanup(tenant_ids)
        cleaner = _publisher(broker_url, prefix)
        cleaner.delete_topology()
        cleaner.close()


def _wait_materialized(
    tenant_ids: list[uuid.UUID], count: int, instant: datetime, timeout_s: float
) -> datetime:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM occurrences_occurrence "
                "WHERE tenant_id = ANY(%s) AND scheduled_for = %s",
                [tenant_ids, instant],
            )
            row = cursor.fetchone()
        if row and row[0] >= count:
            return timezone.now()
        time.sleep(0.25)
    raise RuntimeError("materialization did not finish in time")


def _enqueued(tenant_ids: list[uuid.UUID], instant: datetime) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM occurrences_occurrence WHERE tenant_id = ANY(%s) "
            "AND scheduled_for = %s AND enqueued_at IS NOT NULL",
            [tenant_ids, instant],
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def _report(
    tenant_ids: list[uuid.UUID],
    big: uuid.UUID,
    instant: datetime,
    schedules: int,
    precision: str,
    window_s: int,
    extra_active: int,
    consumer: _Consumer,
    before_instant: bool,
    materialize_s: float,
    cpu: dict[str, float],
    rss: dict[str, float],
) -> BurstReport:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id::text, tenant_id, scheduled_for, available_at, enqueued_at "
            "FROM occurrences_occurrence WHERE tenant_id = ANY(%s) AND scheduled_for = %s",
            [tenant_ids, instant],
        )
        rows = cursor.fetchall()
    lags: list[float] = []
    by_tenant: dict[uuid.UUID, list[float]] = {}
    consumer_lags: list[float] = []
    early = 0
    last_enqueued = instant
    for occ_id, tenant_id, scheduled_for, available_at, enqueued_at in rows:
        reference = available_at if precision == "FLEXIBLE" else scheduled_for
        if enqueued_at is None:
            continue
        lag = (enqueued_at - reference).total_seconds()
        early += lag < 0
        lags.append(lag)
        by_tenant.setdefault(tenant_id, []).append(lag)
        last_enqueued = max(last_enqueued, enqueued_at)
        arrivals = consumer.arrivals.get(occ_id)
        if arrivals:
            consumer_lags.append(min(arrivals) - reference.timestamp())
    small = [lag for tenant, values in by_tenant.items() if tenant != big for lag in values]
    spread = [(a - s).total_seconds() for _, _, s, a, _ in rows]  # available_at - scheduled_for
    stored = {row[0] for row in rows}
    duplicates = sum(len(v) - 1 for k, v in consumer.arrivals.items() if k in stored)
    window = max((last_enqueued - instant).total_seconds(), 1e-3)
    return BurstReport(
        schedules=schedules,
        tenants=len(tenant_ids),
        precision=precision,
        flexible_window_s=window_s,
        extra_active=extra_active,
        materialized_before_instant=before_instant,
        p50_s=round(statistics.median(lags), 3) if lags else float("nan"),
        p95_s=round(_quantile(lags, 0.95), 3),
        p99_s=round(_quantile(lags, 0.99), 3),
        max_s=round(max(lags), 3) if lags else float("nan"),
        consumer_p99_s=round(_quantile(consumer_lags, 0.99), 3),
        missing=schedules - len(lags),
        consumer_missing=schedules - sum(1 for k in stored if k in consumer.arrivals),
        duplicates=duplicates,
        early=early,
        throughput_per_s=round(len(lags) / window, 1),
        small_tenants_p99_s=round(_quantile(small, 0.99), 3),
        big_tenant_p99_s=round(_quantile(by_tenant.get(big, []), 0.99), 3),
        spread_s=round(max(spread) - min(spread), 1) if spread else 0.0,
        materialize_s=round(materialize_s, 2),
        cpu={k: round(v, 2) for k, v in cpu.items()},
        peak_rss_mb={k: round(v, 1) for k, v in rss.items()},
    )


def report_json(report: BurstReport) -> str:
    return json.dumps(asdict(report), sort_keys=True)
