"""Bulk pause benchmark (wrapped by `manage.py bench_bulk`).

A real `manage.py bulk` process pauses N active schedules of one tenant — the job an API
`POST /api/v1/schedules/bulk` writes (`bulk_start`), worked one schedule per transaction
(docs/decisions.md "Bulk changes: …"). Two phases:

1. Alone: a smaller bulk pause with nothing else running, for the cost per paused schedule
   (the bulk process's CPU, its PostgreSQL backend's CPU, WAL) and the rate on its own.
2. Under a burst: `bench_burst` (real materialize and relay processes, an independent
   consumer) with M strict schedules of other tenants due at one instant; the bulk pause of
   the N schedules starts as the pipeline starts, a little before the instant, and must still
   run while the burst is delivered. Reported: the bulk's duration and rate, how far it was
   at the instant and at delivery, and the burst's report (the relay's strict p99 among it).

WAL is read from `pg_current_wal_lsn()`, which counts the whole server: other databases'
writes during the window are included, so it is an upper bound on a shared server.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.db import connection, connections
from django.utils import timezone

from apps.bench import burst as burst_module
from apps.bench.api_load import database_url
from apps.bench.bulk_load import load_not_due_schedules
from apps.bench.fixtures import bench_tenants, bench_tenants_delete, cron_definition
from apps.bench.processes import (
    BenchProcesses,
    backend_cpu,
    backend_cpu_diff,
    proc_cpu_s,
)
from apps.occurrences.bulk_changes import bulk_start
from apps.occurrences.models import BulkChange
from apps.schedules.models import Schedule
from apps.tenants.models import Tenant

BULK_COMMAND = "bulk"
# The burst's relay p99 bound while a bulk change runs (the proof).
P99_BOUND_S = 5.0
SAMPLE_EVERY_S = 0.5
ACTOR = "bench"


@dataclass
class BulkPhase:
    """One bulk pause: how long, how fast, what it counted and what it cost."""

    schedules: int
    duration_s: float
    per_s: float
    changed: int
    already: int
    refused: int
    bulk_cpu_ms_per_schedule: float
    pg_backend_cpu_ms_per_schedule: float
    wal_bytes_per_schedule: float  # the whole server's WAL (an upper bound)


@dataclass
class BulkPauseReport:
    schedules: int
    burst_schedules: int
    alone: BulkPhase | None
    during: BulkPhase
    # `changed` of the bulk when the burst came due and when it was delivered, and whether
    # the bulk was still running at delivery: the two overlapped only if both hold.
    changed_at_instant: int
    changed_at_delivery: int
    running_at_delivery: bool
    # Whether the bulk ran to its end (else measured until delivery), and its duration at
    # the rate measured.
    finished: bool
    estimated_s: float
    strict_p99_s: float
    holds: bool
    load_average: dict[str, list[float]] = field(default_factory=dict)
    burst: dict[str, Any] = field(default_factory=dict)
    timeline: list[dict[str, float]] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = []
        if self.alone is not None:
            out.append(f"bulk pause alone: {_phase_line(self.alone)}")
        out += [
            f"bulk pause during a {self.burst_schedules:,} strict burst: "
            f"{_phase_line(self.during)}",
            f"  finished: {self.finished}; {self.schedules:,} at this rate: "
            f"{self.estimated_s:,.0f} s",
            f"  paused at the instant {self.changed_at_instant:,}, at delivery "
            f"{self.changed_at_delivery:,}, still running at delivery: {self.running_at_delivery}",
            f"  burst strict p99 {self.strict_p99_s:.3f} s (bound {P99_BOUND_S:g} s), p50 "
            f"{self.burst.get('p50_s')} s, max {self.burst.get('max_s')} s, missing "
            f"{self.burst.get('missing')}, duplicates {self.burst.get('duplicates')}",
            f"  cpu s: {self.burst.get('cpu')}",
            f"  load average: {self.load_average}",
            f"  holds: {self.holds}",
        ]
        return out


def _phase_line(phase: BulkPhase) -> str:
    return (
        f"{phase.schedules:,} schedules in {phase.duration_s:.1f} s ({phase.per_s:,.0f}/s); "
        f"changed {phase.changed:,} already {phase.already:,} refused {phase.refused:,}; per "
        f"schedule: bulk {phase.bulk_cpu_ms_per_schedule:.2f} ms CPU, its PostgreSQL backend "
        f"{phase.pg_backend_cpu_ms_per_schedule:.2f} ms CPU, WAL ≤ "
        f"{phase.wal_bytes_per_schedule:,.0f} B"
    )


def _wal_lsn() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def _load_average() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


@dataclass
class _Reading:
    """What a phase's costs are measured from."""

    at: float
    bulk_cpu_s: float
    backends: dict[int, tuple[str, float]]
    wal: int

    @classmethod
    def now(cls, procs: BenchProcesses) -> _Reading:
        process = procs.procs.get(BULK_COMMAND)
        return cls(
            at=time.monotonic(),
            bulk_cpu_s=proc_cpu_s(process.pid) if process else 0.0,
            backends=backend_cpu(),
            wal=_wal_lsn(),
        )


def _phase(job: BulkChange, before: _Reading, after: _Reading) -> BulkPhase:
    counted = max(1, job.changed + job.already + job.refused)
    started = job.created_at
    finished = job.finished_at or timezone.now()
    duration = max((finished - started).total_seconds(), 1e-3)
    backend_s = backend_cpu_diff(before.backends, after.backends).get(BULK_COMMAND, 0.0)
    return BulkPhase(
        schedules=job.matched,
        duration_s=round(duration, 2),
        per_s=round(counted / duration, 1),
        changed=job.changed,
        already=job.already,
        refused=job.refused,
        bulk_cpu_ms_per_schedule=round(1000 * (after.bulk_cpu_s - before.bulk_cpu_s) / counted, 3),
        pg_backend_cpu_ms_per_schedule=round(1000 * backend_s / counted, 3),
        wal_bytes_per_schedule=round((after.wal - before.wal) / counted, 1),
    )


def _wait_done(job: BulkChange, timeout_s: float, procs: BenchProcesses) -> BulkChange:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job.refresh_from_db()
        if job.state == BulkChange.State.DONE:
            return job
        if procs.exited():
            raise RuntimeError(f"a bench process exited: {procs.exited()} (logs in {procs.logs})")
        time.sleep(SAMPLE_EVERY_S)
    raise RuntimeError(f"the bulk change did not finish in {timeout_s:g} s")


def _load(tenant_id: uuid.UUID, count: int, say: Callable[[str], object]) -> None:
    expression = "0 0 1 1 *"
    load_not_due_schedules(
        [tenant_id], [1], count, expression=expression,
        next_run_at=datetime(timezone.now().year + 1, 1, 1, tzinfo=UTC),
        definition=cron_definition(expression, precision=Schedule.Precision.STRICT, window_s=0),
        say=say,
    )  # fmt: skip


def _start(tenant_id: uuid.UUID) -> BulkChange:
    return bulk_start(
        tenant=Tenant.objects.get(id=tenant_id), verb=BulkChange.Verb.PAUSE,
        selection={"filter": {}}, actor=ACTOR,
    )  # fmt: skip


class _Sampler:
    """Reads the job's progress every SAMPLE_EVERY_S on its own connection."""

    def __init__(self, job_id: uuid.UUID) -> None:
        self.job_id = job_id
        self.samples: list[tuple[float, int, str]] = []  # (epoch s, changed, state)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-bulk-sampler", daemon=True)

    def _run(self) -> None:
        try:
            while not self.stopped.is_set():
                row = BulkChange.objects.filter(id=self.job_id).values("changed", "state").first()
                if row is not None:
                    self.samples.append((time.time(), row["changed"], row["state"]))
                self.stopped.wait(SAMPLE_EVERY_S)
        finally:
            connections.close_all()

    def at(self, epoch: float) -> tuple[int, str]:
        """The last reading at or before `epoch` (0, RUNNING before the first)."""
        found = (0, str(BulkChange.State.RUNNING))
        for at, changed, state in self.samples:
            if at > epoch:
                break
            found = (changed, state)
        return found

    def timeline(self, instant: float) -> list[dict[str, float]]:
        """Paused schedules per whole second relative to the instant (the last reading)."""
        rows: dict[int, int] = {}
        for at, changed, _ in self.samples:
            rows[int((at - instant) // 1)] = changed
        return [{"t": t, "changed": n} for t, n in sorted(rows.items())]


def bench_bulk(
    *,
    schedules: int = 100_000,
    burst_schedules: int = 100_000,
    alone_schedules: int = 10_000,
    burst_tenants: int = 10,
    lead_s: float = 60.0,
    timeout_s: float = 900.0,
    finish: bool = True,
    bulk_before_s: float | None = None,
    log: Callable[[str], object] | None = None,
) -> BulkPauseReport:
    """Without `finish`, the bulk during the burst is measured until the burst is delivered
    and left unfinished (its duration is then estimated from its rate). `bulk_before_s`:
    start the bulk that long before the instant (default: as the pipeline starts)."""
    say = log or (lambda message: None)
    prefix = f"tick-bench-{uuid.uuid4().hex[:8]}"
    logs = Path(tempfile.mkdtemp(prefix="tick-bench-bulk-"))
    procs = BenchProcesses(prefix, logs)
    # The database this process uses (a test's own, too), not the environment's.
    procs.env["DATABASE_URL"] = database_url(connection.settings_dict)
    tenant_ids = bench_tenants(prefix, 2)  # [alone, during]
    load: dict[str, list[float]] = {"start": _load_average()}
    try:
        for tenant_id, count in zip(tenant_ids, (alone_schedules, schedules), strict=True):
            if count:
                say(f"loading {count:,} active schedules of tenant {tenant_id}…")
                _load(tenant_id, count, say)
        say(f"process logs in {logs}")
        procs.start_command(BULK_COMMAND)
        alone = None
        if alone_schedules:
            before = _Reading.now(procs)
            job = _wait_done(_start(tenant_ids[0]), timeout_s, procs)
            alone = _phase(job, before, _Reading.now(procs))
            say(f"alone: {_phase_line(alone)}")
        return _during_burst(
            procs, tenant_ids[1], schedules=schedules, burst_schedules=burst_schedules,
            burst_tenants=burst_tenants, lead_s=lead_s, timeout_s=timeout_s, alone=alone,
            finish=finish, load=load, say=say, bulk_before_s=bulk_before_s,
        )  # fmt: skip
    finally:
        procs.stop()
        say("cleaning up…")
        BulkChange.objects.filter(tenant_id__in=tenant_ids).delete()
        bench_tenants_delete(tenant_ids)


def _during_burst(
    procs: BenchProcesses, tenant_id: uuid.UUID, *, schedules: int, burst_schedules: int,
    burst_tenants: int, lead_s: float, timeout_s: float, alone: BulkPhase | None,
    finish: bool, load: dict[str, list[float]], say: Callable[[str], object],
    bulk_before_s: float | None = None,
) -> BulkPauseReport:  # fmt: skip
    box: dict[str, Any] = {}

    def start_bulk() -> None:
        box["before"] = _Reading.now(procs)
        box["job"] = _start(tenant_id)
        box["sampler"] = sampler = _Sampler(box["job"].id)
        sampler.thread.start()
        say(f"bulk pause of {schedules:,} started")

    def start_later() -> None:
        try:
            start_bulk()
        finally:
            connections.close_all()

    def on_started(instant: datetime) -> None:
        box["instant"] = instant
        if bulk_before_s is None:
            start_bulk()
            return
        # A fast bulk started with the pipeline would end before the instant: start it so
        # that it runs across the instant and the delivery.
        delay = max(0.0, instant.timestamp() - bulk_before_s - time.time())
        box["timer"] = timer = threading.Timer(delay, start_later)
        timer.start()

    def on_delivered() -> None:
        box["delivered"] = time.time()
        load["delivered"] = _load_average()

    report = burst_module.bench_burst(
        schedules=burst_schedules, tenants=burst_tenants, lead_s=lead_s,
        timeout_s=min(timeout_s, 300.0), log=say, on_started=on_started,
        on_delivered=on_delivered,
    )  # fmt: skip
    if "timer" in box:
        box["timer"].join()
    sampler: _Sampler = box["sampler"]
    job: BulkChange = box["job"]
    try:
        if finish:
            job = _wait_done(job, timeout_s, procs)
        else:
            job.refresh_from_db()
    finally:
        sampler.stopped.set()
        sampler.thread.join()
    during = _phase(job, box["before"], _Reading.now(procs))
    load["end"] = _load_average()
    instant = box["instant"].timestamp()
    at_instant, _ = sampler.at(instant)
    at_delivery, state = sampler.at(box["delivered"])
    running = state == BulkChange.State.RUNNING
    return BulkPauseReport(
        schedules=schedules,
        burst_schedules=burst_schedules,
        alone=alone,
        during=during,
        changed_at_instant=at_instant,
        changed_at_delivery=at_delivery,
        running_at_delivery=running,
        finished=job.state == BulkChange.State.DONE,
        estimated_s=round(schedules / max(during.per_s, 1e-3), 1),
        strict_p99_s=report.p99_s,
        holds=(
            report.p99_s <= P99_BOUND_S and report.missing == 0 and at_instant > 0 and running
            and (during.changed == schedules or not finish)
        ),
        load_average=load,
        burst=asdict(report),
        timeline=sampler.timeline(instant),
    )  # fmt: skip


def report_json(report: BulkPauseReport) -> str:
    return json.dumps(asdict(report), sort_keys=True)
