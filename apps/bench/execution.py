"""Execution benchmark: when handlers start, not only when they are enqueued
(wrapped by `manage.py bench_execution`).

Start lag = the first attempt's `started_at − scheduled_for` (every bench schedule is strict),
read back from the database. Each scenario runs real `manage.py materialize`, `relay` and
`reap` processes and W Celery workers of C slots each (S = W × C slots) against the real
PostgreSQL and RabbitMQ, on a private queue prefix; every schedule runs the `record` handler,
whose payload's `sleep_s` is the handler's run time. Each scenario starts its own processes
and removes its tenants with every row of theirs, its queues and its workers' presence rows
afterwards, also when it fails.

1. Burst fan-out: one tenant, N strict occurrences due at one instant, handlers sleeping 1 s,
   S slots. Target: the last start within N / S + 2 s of the instant.
2. Noisy neighbour: for M minutes, tenant N floods every minute with 10 × its share of the
   slots (the tenant slot limit Tick derives from the live workers) of handlers that sleep
   far past their schedule's `timeout_s`, while 9 quiet tenants run 20 short handlers
   (5–100 ms) each every minute. N is a tenant of the most crowded queue partition, so that
   quiet tenants also queue behind it. Reported: the quiet tenants' start lag (target p99
   ≤ 2 s), deferred claims, expected against stored occurrences, and how N's runaway
   attempts ended (TIMED_OUT, and how far past the deadline).

Deferrals leave no row behind once relayed, so a watcher thread samples the bench tenants'
retry-lane outbox rows every 0.2 s (a deferral waits at least a second there); afterwards a
row written in the same instant as an attempt of its occurrence finished is a retry, any
other one a deferred claim. The same thread samples each tenant's open attempts (its peak
running count, to hold against its slot limit).
"""

from __future__ import annotations

import json
import math
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from apps.bench.burst import PIPELINE_COMMANDS
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
from apps.occurrences.execution.presence import capacity_forget, tenant_slot_limit
from apps.occurrences.models import Attempt, Lane, Occurrence, WorkerPresence
from apps.occurrences.pipeline.queues import tenant_partition
from apps.schedules.models import Schedule
from apps.tenants.models import Tenant

Say = Callable[[str], object]
# The loops every scenario runs beside its workers: `manage.py` commands (report kinds).
LOOP_COMMANDS = (*PIPELINE_COMMANDS, "reap")
EVERY_MINUTE = "* * * * *"
QUIET_TARGET_P99_S = 2.0
# Quiet handlers run 5 ms … 100 ms: the k-th of a tenant's 20 sleeps k × 5 ms.
QUIET_MAX_SLEEP_S = 0.1
# A runaway handler sleeps on every attempt, not only the first (record's `sleep_attempts`).
RUNAWAY_ATTEMPTS = 1_000_000
# A retry's outbox row is written with the same clock reading as its attempt's finish.
SAME_INSTANT_S = 0.05
WATCH_INTERVAL_S = 0.2
OWN_KIND = "bench"
WORKERS_READY_TIMEOUT_S = 120.0
# From loading the schedules (the processes already up) to their first instant, at least.
LEAD_S = 15.0


@dataclass(frozen=True)
class Pool:
    """W worker processes of C slots (pool processes) each."""

    workers: int
    concurrency: int

    @property
    def slots(self) -> int:
        return self.workers * self.concurrency


# -- figures -------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..1), rounded to ms; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[max(0, math.ceil(q * len(ordered)) - 1)], 3)


def _lag_figures(lags: list[float]) -> dict[str, float | None]:
    return {
        "p50_s": _percentile(lags, 0.50),
        "p99_s": _percentile(lags, 0.99),
        "max_s": _percentile(lags, 1.0),
    }


def _rounded(values: dict[str, float], digits: int) -> dict[str, float]:
    return {key: round(value, digits) for key, value in sorted(values.items())}


@dataclass(frozen=True)
class _Occ:
    """One stored occurrence of the run and its attempts' figures."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    schedule_id: uuid.UUID
    scheduled_for: datetime
    state: str
    finished: bool
    first_started_at: datetime | None

    @property
    def start_lag_s(self) -> float | None:
        if self.first_started_at is None:
            return None
        return (self.first_started_at - self.scheduled_for).total_seconds()


@dataclass(frozen=True)
class _Att:
    occurrence_id: uuid.UUID
    tenant_id: uuid.UUID
    started_at: datetime
    finished_at: datetime | None
    outcome: str


def _stored(tenant_ids: list[uuid.UUID], since: datetime) -> tuple[list[_Occ], list[_Att]]:
    """The run's occurrences (due from `since` on) and their attempts."""
    attempts = [
        _Att(*row)
        for row in Attempt.objects.filter(tenant_id__in=tenant_ids, scheduled_for__gte=since)
        .order_by("started_at")
        .values_list("occurrence_id", "tenant_id", "started_at", "finished_at", "outcome")
    ]
    first_start: dict[uuid.UUID, datetime] = {}
    for attempt in attempts:
        first_start.setdefault(attempt.occurrence_id, attempt.started_at)
    rows = Occurrence.objects.filter(tenant_id__in=tenant_ids, scheduled_for__gte=since)
    occurrences = [
        _Occ(occ_id, tenant, schedule, at, state, finished_at is not None, first_start.get(occ_id))
        for occ_id, tenant, schedule, at, state, finished_at in rows.values_list(
            "id", "tenant_id", "schedule_id", "scheduled_for", "state", "finished_at"
        )
    ]
    return occurrences, attempts


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _lags(occurrences: list[_Occ]) -> list[float]:
    return [lag for occ in occurrences if (lag := occ.start_lag_s) is not None]


# -- one scenario's stack --------------------------------------------------------------------


@dataclass
class _Stack:
    prefix: str
    procs: BenchProcesses
    tenant_ids: list[uuid.UUID] = field(default_factory=list)
    services_before: dict[str, float] = field(default_factory=dict)
    workers_ready_s: float | None = None

    def start(self, pool: Pool, say: Say) -> None:
        """The loops and the workers, as the Procfile runs them, on the bench's prefix; back
        once the workers consume and have announced their slots."""
        self.services_before = services_cpu()
        for command in LOOP_COMMANDS:
            self.procs.start_command(command)
        self.procs.start_workers(pool.workers, pool.concurrency)
        self.workers_ready_s = self.procs.wait_workers_ready(WORKERS_READY_TIMEOUT_S)
        if self.workers_ready_s is None:
            raise RuntimeError(f"workers not consuming after {WORKERS_READY_TIMEOUT_S:.0f} s")
        say(f"workers ready after {self.workers_ready_s:.1f} s")

    def slot_limit(self) -> int:
        """The most slots one tenant may hold, as the claim reckons it from the live workers'
        presence (execution/presence.py)."""
        deadline = time.monotonic() + WORKERS_READY_TIMEOUT_S
        while time.monotonic() < deadline:
            capacity_forget()
            limit = tenant_slot_limit()
            if limit is not None:
                return limit
            time.sleep(0.5)
        raise RuntimeError("the workers announced no slots")

    def usage(self) -> tuple[dict[str, float], dict[str, float]]:
        cpu, rss = self.procs.usage(self.services_before, own_kind=OWN_KIND)
        return _rounded(cpu, 2), _rounded(rss, 1)


@contextmanager
def _stack(tenants: int, say: Say) -> Iterator[_Stack]:
    """Fresh tenants and a private queue topology; on the way out, whatever happened: the
    processes stopped, then every row, presence row and queue of the run removed."""
    prefix = f"tick-exec-{uuid.uuid4().hex[:8]}"
    logs = Path(tempfile.mkdtemp(prefix="tick-bench-"))
    say(f"process logs in {logs}")
    stack = _Stack(prefix, BenchProcesses(prefix, logs))
    broker_url = settings.CELERY_BROKER_URL
    try:
        stack.tenant_ids.extend(bench_tenants(prefix, tenants))
        declare_topology(broker_url, prefix)
        yield stack
    finally:
        stack.procs.stop()
        say("cleaning up…")
        bench_tenants_delete(stack.tenant_ids)
        WorkerPresence.objects.filter(hostname__startswith=prefix).delete()
        delete_topology(broker_url, prefix)


def _copy_every_minute(
    tenant_id: uuid.UUID,
    payloads: list[dict[str, Any]],
    *,
    first: datetime,
    end_at: datetime | None = None,
    timeout_s: int | None = None,
) -> list[uuid.UUID]:
    """One strict cron schedule per payload, first due at `first`: every minute until
    `end_at` (exclusive), or once at `first` without it. Returns their ids."""
    expression = (
        EVERY_MINUTE if end_at else f"{first.minute} {first.hour} {first.day} {first.month} *"
    )
    now = timezone.now()
    batch = ScheduleBatch()
    ids = []
    for payload in payloads:
        extra: dict[str, Any] = {"payload": payload, "timeout_s": timeout_s}
        if end_at:
            extra["end_at"] = end_at.isoformat()
        definition = cron_definition(
            expression, precision=Schedule.Precision.STRICT, window_s=0, **extra
        )
        schedule_id = uuid.uuid4()
        batch.add_schedule(
            schedule_id, tenant_id, expression=expression, time_zone="UTC",
            precision=Schedule.Precision.STRICT, flexible_window_s=0, next_run_at=first,
            created_at=now, definition=definition, payload=json.dumps(payload),
            timeout_s=timeout_s, end_at=end_at,
        )  # fmt: skip
        batch.add_created_event(schedule_id, tenant_id, now)
        ids.append(schedule_id)
    with connection.cursor() as cursor:
        batch.copy(cursor)
    return ids


def _wait_until(done: Callable[[], bool], deadline: datetime, poll_s: float = 0.5) -> bool:
    """Poll `done` until it holds (True) or `deadline` passes (False)."""
    while timezone.now() < deadline:
        if done():
            return True
        time.sleep(poll_s)
    return done()


# -- scenario 1: burst fan-out ---------------------------------------------------------------


@dataclass(kw_only=True)
class _RunCosts:
    """What a scenario's processes cost, and which exited before the end (name: code)."""

    exited: dict[str, int] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    peak_rss_mb: dict[str, float] = field(default_factory=dict)

    def cost_lines(self) -> list[str]:
        return [
            f"  exited early: {self.exited or 'none'}",
            f"  cpu s: {self.cpu}",
            f"  peak rss MiB: {self.peak_rss_mb}",
        ]


@dataclass(kw_only=True)
class FanOutReport(_RunCosts):
    occurrences: int
    workers: int
    slots: int
    handler_sleep_s: float
    tenant_slot_limit: int
    workers_ready_s: float | None
    started: int
    finished: int
    p50_s: float | None
    p99_s: float | None
    max_s: float | None
    target_max_s: float
    passed: bool

    def lines(self) -> list[str]:
        return [
            f"fan-out: {self.occurrences} strict occurrences of one tenant at one instant, "
            f"handler sleeps {self.handler_sleep_s} s, {self.slots} slots in "
            f"{self.workers} workers, a tenant may hold {self.tenant_slot_limit}",
            f"  start lag: p50 {self.p50_s} s  p99 {self.p99_s} s  max {self.max_s} s "
            f"(target max ≤ {self.target_max_s} s: {'pass' if self.passed else 'FAIL'})",
            f"  started {self.started}, finished {self.finished}; workers ready after "
            f"{self.workers_ready_s} s",
            *self.cost_lines(),
        ]


def bench_fan_out(
    *,
    pool: Pool,
    occurrences: int = 200,
    sleep_s: float = 1.0,
    lead_s: float = LEAD_S,
    timeout_s: float | None = None,
    say: Say,
) -> FanOutReport:
    """Scenario 1 (module docstring)."""
    target_s = round(occurrences / pool.slots + 2, 1)
    wait_s = timeout_s or max(120.0, 2 * occurrences * sleep_s / pool.slots + 60)
    with _stack(1, say) as stack:
        tenant_id = stack.tenant_ids[0]
        # Tick's capacity is measured, not the tenant's quota: it may run all of them at once.
        Tenant.objects.filter(id=tenant_id).update(max_running=occurrences)
        stack.start(pool, say)
        instant = next_whole_minute(timezone.now(), lead_s)
        say(f"loading {occurrences} schedules due at {instant.isoformat()}…")
        _copy_every_minute(tenant_id, [{"sleep_s": sleep_s}] * occurrences, first=instant)
        finished = Occurrence.objects.filter(
            tenant_id=tenant_id, scheduled_for=instant, finished_at__isnull=False
        )
        _wait_until(lambda: finished.count() >= occurrences, instant + timedelta(seconds=wait_s))
        cpu, rss = stack.usage()
        stored, _ = _stored(stack.tenant_ids, instant)
        lags = _lag_figures(_lags(stored))
        worst = lags["max_s"]
        return FanOutReport(
            occurrences=occurrences, workers=pool.workers, slots=pool.slots,
            handler_sleep_s=sleep_s, tenant_slot_limit=stack.slot_limit(),
            workers_ready_s=_seconds(stack.workers_ready_s),
            started=len(_lags(stored)), finished=sum(occ.finished for occ in stored), **lags,
            target_max_s=target_s,
            passed=worst is not None and worst <= target_s and len(_lags(stored)) == occurrences,
            exited=stack.procs.exited(), cpu=cpu, peak_rss_mb=rss,
        )  # fmt: skip


# -- scenario 2: noisy neighbour -------------------------------------------------------------


@dataclass(frozen=True)
class NoisyPlan:
    """Who runs what: tenant N (the first tenant) and the quiet ones, for `minutes`. N's
    `share` is the tenant slot limit Tick derives from the live workers, read at run time."""

    minutes: int
    slots: int
    share: int = 1
    quiet_tenants: int = 9
    quiet_per_tenant: int = 20
    flood_factor: int = 10
    runaway_timeout_s: int = 2
    runaway_sleep_s: float = 30.0

    @property
    def flood(self) -> int:
        return self.flood_factor * self.share

    def quiet_sleeps(self) -> list[float]:
        n = self.quiet_per_tenant
        return [round(QUIET_MAX_SLEEP_S * (k + 1) / n, 4) for k in range(n)]

    def runaway_payload(self) -> dict[str, Any]:
        return {"sleep_s": self.runaway_sleep_s, "sleep_attempts": RUNAWAY_ATTEMPTS}

    @property
    def quiet_work_per_minute_s(self) -> float:
        """Slot-seconds the quiet handlers due at one minute need."""
        return self.quiet_tenants * sum(self.quiet_sleeps())


class _Watcher(threading.Thread):
    """Samples, every WATCH_INTERVAL_S on its own connection until stopped, the tenants'
    retry-lane outbox rows (module docstring) and their open attempts: `seen` maps each row's
    id to (occurrence, tenant, created); `peak_running` is each tenant's most open attempts,
    what the claim counts against the tenant's slot limit. (Attempt timestamps cannot tell
    it: a claim reads its clock before it waits for the tenant lock.)"""

    def __init__(self, tenant_ids: list[uuid.UUID]) -> None:
        super().__init__(name="bench-watcher", daemon=True)
        self.tenant_ids = tenant_ids
        self.seen: dict[int, tuple[uuid.UUID, uuid.UUID, datetime]] = {}
        self.peak_running: Counter[uuid.UUID] = Counter()
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            while not self.halt.wait(WATCH_INTERVAL_S):
                with connection.cursor() as cursor:
                    self._sample(cursor)
        finally:
            connection.close()

    def _sample(self, cursor: CursorWrapper) -> None:
        cursor.execute(
            "SELECT id, occurrence_id, tenant_id, created_at FROM occurrences_dispatchoutbox "
            "WHERE tenant_id = ANY(%s) AND lane = %s",
            [self.tenant_ids, str(Lane.RETRY)],
        )
        for row_id, occurrence_id, tenant_id, created_at in cursor.fetchall():
            self.seen[row_id] = (occurrence_id, tenant_id, created_at)
        cursor.execute(
            "SELECT tenant_id, count(*) FROM occurrences_attempt "
            "WHERE tenant_id = ANY(%s) AND finished_at IS NULL GROUP BY tenant_id",
            [self.tenant_ids],
        )
        for tenant_id, running in cursor.fetchall():
            self.peak_running[tenant_id] = max(self.peak_running[tenant_id], running)

    def stop(self) -> None:
        self.halt.set()
        self.join(10)


def _deferrals(
    seen: dict[int, tuple[uuid.UUID, uuid.UUID, datetime]], attempts: list[_Att]
) -> Counter[uuid.UUID]:
    """Deferred claims per tenant: sampled retry-lane rows not written with a finish."""
    finishes: dict[uuid.UUID, list[datetime]] = {}
    for attempt in attempts:
        if attempt.finished_at is not None:
            finishes.setdefault(attempt.occurrence_id, []).append(attempt.finished_at)
    deferred: Counter[uuid.UUID] = Counter()
    for occurrence_id, tenant_id, created_at in seen.values():
        is_retry = any(
            abs((created_at - done).total_seconds()) < SAME_INSTANT_S
            for done in finishes.get(occurrence_id, [])
        )
        deferred[tenant_id] += not is_retry
    return deferred


@dataclass(kw_only=True)
class NoisyReport(_RunCosts):
    minutes: int
    slots: int
    noisy_share: int
    noisy_per_minute: int
    quiet_tenants: int
    quiet_per_minute: int
    quiet_work_per_minute_s: float
    runaway_timeout_s: int
    runaway_sleep_s: float
    workers_ready_s: float | None
    # the quiet tenants
    quiet_expected: int
    quiet_started: int
    quiet_finished: int
    quiet_p50_s: float | None
    quiet_p99_s: float | None
    quiet_max_s: float | None
    quiet_p99_by_minute_s: list[float | None]
    quiet_tenants_on_noisy_partition: int
    quiet_p99_same_partition_as_noisy_s: float | None
    quiet_p99_other_partitions_s: float | None
    quiet_target_p99_s: float
    quiet_passed: bool
    quiet_deferred: int
    # tenant N
    noisy_expected: int
    noisy_stored: int
    noisy_states: dict[str, int]
    noisy_deferred: int
    noisy_peak_running: int
    quiet_peak_running: int
    noisy_attempt_outcomes: dict[str, int]
    noisy_timed_out: int
    noisy_deadline_overrun_p50_s: float | None
    noisy_deadline_overrun_max_s: float | None
    noisy_longest_attempt_s: float | None
    # both
    missing: int
    unexpected: int

    def lines(self) -> list[str]:
        ok = "pass" if self.quiet_passed else "FAIL"
        return [
            f"noisy neighbour: {self.minutes} min, {self.slots} slots; N floods "
            f"{self.noisy_per_minute}/min (share {self.noisy_share}), runaways sleep "
            f"{self.runaway_sleep_s} s past timeout_s {self.runaway_timeout_s}; "
            f"{self.quiet_tenants} quiet tenants × {self.quiet_per_minute // self.quiet_tenants}"
            f"/min ({self.quiet_work_per_minute_s:.2f} slot-s per minute)",
            f"  quiet start lag: p50 {self.quiet_p50_s} s  p99 {self.quiet_p99_s} s  max "
            f"{self.quiet_max_s} s (target p99 ≤ {self.quiet_target_p99_s} s: {ok}); "
            f"by minute {self.quiet_p99_by_minute_s}",
            f"  quiet p99 on N's queue partition ({self.quiet_tenants_on_noisy_partition} "
            f"tenants) {self.quiet_p99_same_partition_as_noisy_s} s, elsewhere "
            f"{self.quiet_p99_other_partitions_s} s; started {self.quiet_started}/"
            f"{self.quiet_expected}, finished {self.quiet_finished}, deferred "
            f"{self.quiet_deferred}",
            f"  N: stored {self.noisy_stored}/{self.noisy_expected}, states "
            f"{self.noisy_states}, deferred {self.noisy_deferred}, peak running "
            f"{self.noisy_peak_running} (a quiet tenant's: {self.quiet_peak_running})",
            f"  N's attempts: {self.noisy_attempt_outcomes}; TIMED_OUT {self.noisy_timed_out}, "
            f"past the deadline p50 {self.noisy_deadline_overrun_p50_s} s max "
            f"{self.noisy_deadline_overrun_max_s} s; longest {self.noisy_longest_attempt_s} s",
            f"  missing {self.missing}, unexpected {self.unexpected}; workers ready after "
            f"{self.workers_ready_s} s",
            *self.cost_lines(),
        ]


@dataclass(frozen=True)
class _NoisyRun:
    """What the scenario set up: which schedules, from when, until when."""

    plan: NoisyPlan
    noisy: uuid.UUID
    quiet: list[uuid.UUID]
    schedules: dict[uuid.UUID, uuid.UUID]  # schedule -> tenant
    first: datetime
    end_at: datetime

    @property
    def instants(self) -> list[datetime]:
        return [self.first + timedelta(minutes=k) for k in range(self.plan.minutes)]


def _crowded_first(tenant_ids: list[uuid.UUID]) -> list[uuid.UUID]:
    """The tenants, one of those on the most crowded queue partition first: as N, it shares
    its partition with at least one quiet tenant whenever the tenants outnumber partitions."""
    partitions = settings.TICK_TENANT_PARTITIONS
    crowd = Counter(tenant_partition(t, partitions) for t in tenant_ids)
    noisy = max(tenant_ids, key=lambda t: crowd[tenant_partition(t, partitions)])
    return [noisy] + [t for t in tenant_ids if t != noisy]


def _load_noisy(stack: _Stack, plan: NoisyPlan, first: datetime) -> _NoisyRun:
    noisy, *quiet = _crowded_first(stack.tenant_ids)
    end_at = first + timedelta(minutes=plan.minutes)
    schedules = dict.fromkeys(
        _copy_every_minute(
            noisy,
            [plan.runaway_payload()] * plan.flood,
            first=first,
            end_at=end_at,
            timeout_s=plan.runaway_timeout_s,
        ),
        noisy,
    )
    for tenant_id in quiet:
        ids = _copy_every_minute(
            tenant_id, [{"sleep_s": s} for s in plan.quiet_sleeps()], first=first, end_at=end_at
        )
        schedules.update(dict.fromkeys(ids, tenant_id))
    return _NoisyRun(plan, noisy, quiet, schedules, first, end_at)


def _quiet_figures(run: _NoisyRun, quiet: list[_Occ]) -> dict[str, Any]:
    partitions = settings.TICK_TENANT_PARTITIONS
    noisy_partition = tenant_partition(run.noisy, partitions)
    on_noisy_partition = {
        t for t in run.quiet if tenant_partition(t, partitions) == noisy_partition
    }
    shared = [o for o in quiet if o.tenant_id in on_noisy_partition]
    others = [o for o in quiet if o.tenant_id not in on_noisy_partition]
    lags = _lag_figures(_lags(quiet))
    p99 = lags["p99_s"]
    expected = len(run.quiet) * run.plan.quiet_per_tenant * run.plan.minutes
    started = len(_lags(quiet))
    return {
        "quiet_expected": expected,
        "quiet_started": started,
        "quiet_finished": sum(o.finished for o in quiet),
        **{f"quiet_{name}": value for name, value in lags.items()},
        "quiet_p99_by_minute_s": [
            _percentile(_lags([o for o in quiet if o.scheduled_for == at]), 0.99)
            for at in run.instants
        ],
        "quiet_tenants_on_noisy_partition": len(on_noisy_partition),
        "quiet_p99_same_partition_as_noisy_s": _percentile(_lags(shared), 0.99),
        "quiet_p99_other_partitions_s": _percentile(_lags(others), 0.99),
        "quiet_target_p99_s": QUIET_TARGET_P99_S,
        # An occurrence that never started counts against the target, not for it.
        "quiet_passed": p99 is not None and p99 <= QUIET_TARGET_P99_S and started == expected,
    }


def _noisy_attempt_figures(run: _NoisyRun, attempts: list[_Att], until: datetime) -> dict[str, Any]:
    """How N's attempts ended, and how far past `timeout_s` its TIMED_OUT ones stopped."""
    timeout_s = run.plan.runaway_timeout_s
    overruns = [
        (a.finished_at - a.started_at).total_seconds() - timeout_s
        for a in attempts
        if a.finished_at is not None and a.outcome == Attempt.Outcome.TIMED_OUT
    ]
    durations = [((a.finished_at or until) - a.started_at).total_seconds() for a in attempts]
    return {
        "noisy_attempt_outcomes": dict(
            sorted(Counter(a.outcome or "open" for a in attempts).items())
        ),
        "noisy_timed_out": len(overruns),
        "noisy_deadline_overrun_p50_s": _percentile(overruns, 0.5),
        "noisy_deadline_overrun_max_s": _percentile(overruns, 1.0),
        "noisy_longest_attempt_s": _percentile(durations, 1.0),
    }


def _noisy_figures(
    run: _NoisyRun, occurrences: list[_Occ], attempts: list[_Att], watcher: _Watcher
) -> dict[str, Any]:
    """Quiet lags, N's occurrences and attempts, what the watcher saw, and expected against
    stored."""
    deferred = _deferrals(watcher.seen, attempts)
    expected = {(s, at) for s in run.schedules for at in run.instants}
    stored = {(o.schedule_id, o.scheduled_for) for o in occurrences}
    ours = [o for o in occurrences if (o.schedule_id, o.scheduled_for) in expected]
    noisy = [o for o in ours if o.tenant_id == run.noisy]
    noisy_attempts = [a for a in attempts if a.tenant_id == run.noisy]
    return {
        **_quiet_figures(run, [o for o in ours if o.tenant_id != run.noisy]),
        "quiet_deferred": sum(deferred[t] for t in run.quiet),
        "noisy_expected": run.plan.flood * run.plan.minutes,
        "noisy_stored": len(noisy),
        "noisy_states": dict(sorted(Counter(o.state for o in noisy).items())),
        "noisy_deferred": deferred[run.noisy],
        "noisy_peak_running": watcher.peak_running[run.noisy],
        "quiet_peak_running": max((watcher.peak_running[t] for t in run.quiet), default=0),
        **_noisy_attempt_figures(run, noisy_attempts, timezone.now()),
        "missing": len(expected - stored),
        "unexpected": len(stored - expected),
    }


def _plan_figures(plan: NoisyPlan) -> dict[str, Any]:
    return {
        "minutes": plan.minutes,
        "slots": plan.slots,
        "noisy_share": plan.share,
        "noisy_per_minute": plan.flood,
        "quiet_tenants": plan.quiet_tenants,
        "quiet_per_minute": plan.quiet_tenants * plan.quiet_per_tenant,
        "quiet_work_per_minute_s": round(plan.quiet_work_per_minute_s, 3),
        "runaway_timeout_s": plan.runaway_timeout_s,
        "runaway_sleep_s": plan.runaway_sleep_s,
    }


def _await_quiet_finished(run: _NoisyRun, drain_s: float, say: Say) -> None:
    """Until the last minute has passed and every quiet occurrence finished, or `drain_s`
    after the last minute."""
    quiet_finished = Occurrence.objects.filter(
        tenant_id__in=run.quiet,
        scheduled_for__gte=run.first,
        scheduled_for__lt=run.end_at,
        finished_at__isnull=False,
    )
    quiet_total = len(run.quiet) * run.plan.quiet_per_tenant * run.plan.minutes
    say(f"running until {run.end_at.isoformat()} (+ up to {drain_s:.0f} s for the quiet ones)")
    _wait_until(lambda: timezone.now() >= run.end_at, run.end_at, poll_s=1.0)
    _wait_until(
        lambda: quiet_finished.count() >= quiet_total, run.end_at + timedelta(seconds=drain_s)
    )


def bench_noisy_neighbour(
    *, pool: Pool, plan: NoisyPlan, lead_s: float = LEAD_S, drain_s: float = 60.0, say: Say
) -> NoisyReport:
    """Scenario 2 (module docstring)."""
    with _stack(plan.quiet_tenants + 1, say) as stack:
        stack.start(pool, say)
        plan = replace(plan, share=stack.slot_limit())
        first = next_whole_minute(timezone.now(), lead_s)
        say(f"loading {plan.flood} noisy and {plan.quiet_tenants * plan.quiet_per_tenant} "
            f"quiet schedules, every minute from {first.isoformat()}…")  # fmt: skip
        run = _load_noisy(stack, plan, first)
        watcher = _Watcher(stack.tenant_ids)
        watcher.start()
        try:
            _await_quiet_finished(run, drain_s, say)
        finally:
            watcher.stop()
        cpu, rss = stack.usage()
        occurrences, attempts = _stored(stack.tenant_ids, first)
        return NoisyReport(
            **_plan_figures(plan),
            workers_ready_s=_seconds(stack.workers_ready_s),
            **_noisy_figures(run, occurrences, attempts, watcher),
            exited=stack.procs.exited(), cpu=cpu, peak_rss_mb=rss,
        )  # fmt: skip


# -- both ------------------------------------------------------------------------------------


@dataclass
class ExecutionReport:
    fan_out: FanOutReport | None = None
    noisy_neighbour: NoisyReport | None = None

    def lines(self) -> list[str]:
        parts = (self.fan_out, self.noisy_neighbour)
        return [line for part in parts if part is not None for line in part.lines()]


def report_json(report: ExecutionReport) -> str:
    return json.dumps(asdict(report), sort_keys=True)
