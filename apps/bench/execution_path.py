"""The execution path under sustained load (bench_sustained `--workers`): real Celery prefork
workers run every occurrence with the `noop` handler, so each one is claimed and completed.

Reported for the measured minutes:
- executed occurrences (attempts that SUCCEEDED in the window) per minute and per second, the
  start lag p99 (first attempt's `started_at` minus the reference instant: `scheduled_for`,
  or `available_at` for flexible rows), rows of the window not executed by the end;
- PostgreSQL CPU per executed occurrence per phase: the backends serving each kind of bench
  process (`processes.backend_cpu`: materialize, relay, worker), the workers' split between
  claim and complete by the statement time pg_stat_statements gives each phase (pg_profile),
  the rest of the server (WAL writer, checkpointer, autovacuum) and the bench's own backend
  (its samples, part of "all" and of Tick's figure) apart;
- CPU of every process per executed occurrence beside the same for bare Celery
  (`bare_celery_floor`: the same number of workers and slots, `apply_async` → `bare.noop` on
  the same broker, run right after Tick's processes stopped), and their ratio.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.db import connection

from apps.bench.bare_celery import BROKER_ENV, TASK_NAME
from apps.bench.pg_profile import Phase, Profile
from apps.bench.processes import (
    OWN_BACKEND_KIND,
    WORKER_KIND,
    WORKER_POOL_KIND,
    BenchProcesses,
    child_pids,
    proc_cpu_s,
    services_cpu,
)
from apps.occurrences.models import Attempt, Lane, Occurrence

# The handler of the schedules when workers execute them (execution/handlers.py).
EXECUTION_HANDLER = "noop"
# Celery's INFO line for each task that returned.
SUCCEEDED_MARK = b" succeeded in "
BARE_DRAIN_S = 120.0
BARE_READY_TIMEOUT_S = 120.0
# Process kinds whose CPU is Tick's cost per executed occurrence (beside bench.sustained's).
TICK_KINDS = ("materialize", "relay", WORKER_KIND, WORKER_POOL_KIND, "postgresql", "rabbitmq")
BARE_KINDS = (WORKER_KIND, WORKER_POOL_KIND, "rabbitmq", "publisher")


def worker_tree_cpu(procs: BenchProcesses) -> dict[str, float]:
    """CPU seconds so far of the workers (main processes) and of their pool processes, those
    already replaced included."""
    cpu = {WORKER_KIND: 0.0, WORKER_POOL_KIND: 0.0}
    for name, proc in procs.procs.items():
        if procs.kinds[name] != WORKER_KIND:
            continue
        own = proc_cpu_s(proc.pid)
        cpu[WORKER_KIND] += own
        cpu[WORKER_POOL_KIND] += proc_cpu_s(proc.pid, reaped_children=True) - own
        cpu[WORKER_POOL_KIND] += sum(proc_cpu_s(child) for child in child_pids(proc.pid))
    return cpu


# -- what the stored rows say --------------------------------------------------------------

_EXECUTION_SQL = """
    WITH w AS (
        SELECT o.id, o.scheduled_for, o.state,
               CASE WHEN o.lane = %(flexible_lane)s THEN o.available_at ELSE o.scheduled_for END
                   AS ref
          FROM occurrences_occurrence o
         WHERE o.tenant_id = ANY(%(tenants)s)
           AND o.scheduled_for >= %(lo)s AND o.scheduled_for < %(end)s
    ), lags AS (
        SELECT w.state, extract(epoch FROM a.started_at - w.ref)::float8 AS lag
          FROM w LEFT JOIN occurrences_attempt a
            ON a.occurrence_id = w.id AND a.scheduled_for = w.scheduled_for AND a.attempt_no = 1
         WHERE w.ref >= %(start)s AND w.ref < %(end)s
    )
    SELECT count(*), count(*) FILTER (WHERE state = %(succeeded)s),
           percentile_disc(0.99) WITHIN GROUP (ORDER BY lag),
           percentile_disc(0.50) WITHIN GROUP (ORDER BY lag), max(lag)
      FROM lags
"""

_EXECUTED_PER_MINUTE_SQL = """
    SELECT date_trunc('minute', a.finished_at), count(*)
      FROM occurrences_attempt a
     WHERE a.tenant_id = ANY(%(tenants)s) AND a.scheduled_for >= %(lo)s
       AND a.scheduled_for < %(end)s AND a.outcome = %(succeeded_outcome)s
       AND a.finished_at >= %(start)s AND a.finished_at < %(end)s
  GROUP BY 1
"""


@dataclass
class StoredExecution:
    window_rows: int = 0
    succeeded: int = 0
    start_lag_p50_s: float | None = None
    start_lag_p99_s: float | None = None
    start_lag_max_s: float | None = None
    executed_per_minute: dict[str, int] = field(default_factory=dict)

    @property
    def executed(self) -> int:
        return sum(self.executed_per_minute.values())


def stored_execution(tenant_ids: list[uuid.UUID], start: datetime, end: datetime, *,
                     lo: datetime) -> StoredExecution:  # fmt: skip
    """Start lags of the rows whose reference instant lies in [start, end) and the attempts
    that succeeded in each minute of that window (`lo`: the earliest `scheduled_for`)."""
    params: dict[str, Any] = {
        "tenants": tenant_ids, "flexible_lane": Lane.FLEXIBLE, "lo": lo, "start": start,
        "end": end, "succeeded": Occurrence.State.SUCCEEDED,
        "succeeded_outcome": Attempt.Outcome.SUCCEEDED,
    }  # fmt: skip
    out = StoredExecution()
    with connection.cursor() as cursor:
        cursor.execute(_EXECUTION_SQL, params)
        row = cursor.fetchone()
        if row:
            out.window_rows, out.succeeded = int(row[0]), int(row[1])
            out.start_lag_p99_s, out.start_lag_p50_s, out.start_lag_max_s = (
                None if v is None else round(float(v), 3) for v in row[2:5]
            )
        cursor.execute(_EXECUTED_PER_MINUTE_SQL, params)
        out.executed_per_minute = {
            minute.isoformat(): int(count) for minute, count in sorted(cursor.fetchall())
        }
    return out


def unfinished_count(tenant_ids: list[uuid.UUID], start: datetime, end: datetime, *,
                     lo: datetime) -> int:  # fmt: skip
    """Rows of the window not finished yet (the drain waits for none)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM occurrences_occurrence WHERE tenant_id = ANY(%s) "
            "AND scheduled_for >= %s AND scheduled_for < %s AND finished_at IS NULL",
            [tenant_ids, lo, end],
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


# -- the figures ---------------------------------------------------------------------------


def _per(value: float, count: int, scale: float = 1e6) -> float | None:
    return round(value * scale / count, 1) if count else None


@dataclass
class BareCeleryFloor:
    workers: int
    concurrency: int
    tasks: int
    executed: int
    seconds: float
    cpu_s: dict[str, float]
    cpu_us_per_task: float | None

    @property
    def per_second(self) -> float | None:
        return round(self.executed / self.seconds, 1) if self.seconds else None

    def lines(self) -> list[str]:
        cpu = " ".join(f"{k}={v}" for k, v in sorted(self.cpu_s.items()))
        return [
            f"  bare Celery ({self.workers}x{self.concurrency} slots, apply_async -> "
            f"{TASK_NAME}): {self.executed:,}/{self.tasks:,} executed in {self.seconds:.1f} s "
            f"({self.per_second}/s); CPU per task {self.cpu_us_per_task} µs ({cpu})"
        ]


def _ratio(tick_us: float | None, bare: BareCeleryFloor | None) -> float | None:
    if tick_us and bare is not None and bare.cpu_us_per_task:
        return round(tick_us / bare.cpu_us_per_task, 2)
    return None


@dataclass
class ExecutionWork:
    """The execution path's figures of one sustained run (module docstring)."""

    workers: int
    concurrency: int
    stored: StoredExecution
    minutes: int
    backend_cpu_s: dict[str, float]
    pg_cpu_s: float
    cpu_s: dict[str, float]
    pg_us_per_phase: dict[str, float | None] = field(default_factory=dict)
    tick_cpu_us: float | None = None
    bare: BareCeleryFloor | None = None
    ratio_to_bare: float | None = None
    tick_cpu_us_net: float | None = None
    ratio_to_bare_net: float | None = None

    @property
    def executed_per_s(self) -> float | None:
        return round(self.stored.executed / (self.minutes * 60), 1) if self.minutes else None

    @classmethod
    def of(
        cls, *, workers: int, concurrency: int, stored: StoredExecution, minutes: int,
        backend_cpu_s: dict[str, float], cpu_s: dict[str, float], profile: Profile,
        bare: BareCeleryFloor | None,
    ) -> ExecutionWork:  # fmt: skip
        executed = stored.executed
        pg = cpu_s.get("postgresql", 0.0)
        worker_pg = backend_cpu_s.get(WORKER_KIND, 0.0)
        phases = profile.phases()
        claim_ms = phases.get(Phase.CLAIM, {}).get("total_ms", 0.0)
        complete_ms = phases.get(Phase.COMPLETE, {}).get("total_ms", 0.0)
        claim_share = claim_ms / (claim_ms + complete_ms) if claim_ms + complete_ms else 0.5
        backends = sum(backend_cpu_s.values())
        per_phase = {
            "materialize": _per(backend_cpu_s.get("materialize", 0.0), executed),
            "relay": _per(backend_cpu_s.get("relay", 0.0), executed),
            "claim": _per(worker_pg * claim_share, executed),
            "complete": _per(worker_pg * (1 - claim_share), executed),
            "claim+complete": _per(worker_pg, executed),
            "rest of the server": _per(max(0.0, pg - backends), executed),
            "bench's own backend": _per(backend_cpu_s.get(OWN_BACKEND_KIND, 0.0), executed),
            "all": _per(pg, executed),
        }
        tick = sum(cpu_s.get(kind, 0.0) for kind in TICK_KINDS)
        tick_us = _per(tick, executed)
        # The same without the bench's own backend (its samples are the measurement's cost).
        net_us = _per(tick - backend_cpu_s.get(OWN_BACKEND_KIND, 0.0), executed)
        return cls(
            workers=workers, concurrency=concurrency, stored=stored, minutes=minutes,
            backend_cpu_s=backend_cpu_s, pg_cpu_s=pg, cpu_s=cpu_s, pg_us_per_phase=per_phase,
            tick_cpu_us=tick_us, bare=bare, ratio_to_bare=_ratio(tick_us, bare),
            tick_cpu_us_net=net_us, ratio_to_bare_net=_ratio(net_us, bare),
        )  # fmt: skip

    def lines(self) -> list[str]:
        s = self.stored
        phases = ", ".join(f"{k} {v}" for k, v in self.pg_us_per_phase.items())
        out = [
            f"  execution ({self.workers}x{self.concurrency} slots, noop): {s.executed:,} "
            f"executed in the window ({self.executed_per_s}/s), {s.succeeded:,}/"
            f"{s.window_rows:,} window rows SUCCEEDED; start lag p50 {s.start_lag_p50_s} s, "
            f"p99 {s.start_lag_p99_s} s, max {s.start_lag_max_s} s",
            f"  PostgreSQL CPU per executed occurrence (µs): {phases}",
            f"  CPU per executed occurrence, every Tick process + PostgreSQL + RabbitMQ: "
            f"{self.tick_cpu_us} µs ({self.tick_cpu_us_net} µs without the bench's own "
            f"backend)",
        ]
        if self.bare is not None:
            out += self.bare.lines()
            out.append(
                f"  Tick / bare Celery CPU per occurrence: {self.ratio_to_bare}x "
                f"({self.ratio_to_bare_net}x without the bench's own backend)"
            )
        return out


# -- bare Celery ---------------------------------------------------------------------------


def _succeeded_in_logs(procs: BenchProcesses) -> int:
    return sum(
        (procs.logs / f"{name}.log").read_bytes().count(SUCCEEDED_MARK)
        for name, kind in procs.kinds.items()
        if kind == WORKER_KIND
    )


def bare_celery_floor(
    *, broker_url: str, logs: Path, workers: int, concurrency: int, tasks: int, seconds: float,
    say: Any,
) -> BareCeleryFloor:  # fmt: skip
    """`tasks` `apply_async` calls of `bare.noop`, paced evenly over `seconds`, to W bare
    workers of C slots on a private queue; CPU of the workers, RabbitMQ and this process
    (the publisher) from the first publish until the workers logged every task."""
    from apps.bench.bare_celery import app, noop  # the publisher's app

    prefix = f"tick-bare-{uuid.uuid4().hex[:8]}"
    queue = f"{prefix}.noop"
    # Its own directory: its workers' logs would overwrite Tick's workers' of the same names.
    (logs / "bare").mkdir(exist_ok=True)
    procs = BenchProcesses(prefix, logs / "bare")
    procs.env[BROKER_ENV] = broker_url
    app.conf.update(broker_url=broker_url)
    try:
        procs.start_workers(workers, concurrency, app="apps.bench.bare_celery", queues=queue)
        if procs.wait_workers_ready(BARE_READY_TIMEOUT_S) is None:
            raise RuntimeError(f"bare Celery workers not ready (logs in {logs})")
        say(f"bare Celery: {tasks:,} tasks over {seconds:.0f} s…")
        services_before, workers_before = services_cpu(), worker_tree_cpu(procs)
        own_before = proc_cpu_s_self()
        started = time.monotonic()
        every = seconds / tasks if tasks else 0.0
        for n in range(tasks):
            wait = started + n * every - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            noop.apply_async(queue=queue)
        deadline = time.monotonic() + BARE_DRAIN_S
        executed = _succeeded_in_logs(procs)
        while executed < tasks and time.monotonic() < deadline:
            time.sleep(0.25)
            executed = _succeeded_in_logs(procs)
        elapsed = time.monotonic() - started
        cpu = {
            kind: round(after - workers_before[kind], 2)
            for kind, after in worker_tree_cpu(procs).items()
        }
        services_after = services_cpu()
        cpu["rabbitmq"] = round(services_after["rabbitmq"] - services_before["rabbitmq"], 2)
        cpu["publisher"] = round(proc_cpu_s_self() - own_before, 2)
        total = sum(cpu[kind] for kind in BARE_KINDS)
        return BareCeleryFloor(
            workers=workers, concurrency=concurrency, tasks=tasks, executed=executed,
            seconds=round(elapsed, 1), cpu_s=cpu, cpu_us_per_task=_per(total, executed),
        )  # fmt: skip
    finally:
        procs.stop()
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)  # type: ignore[attr-defined]


def proc_cpu_s_self() -> float:
    return proc_cpu_s(os.getpid())
