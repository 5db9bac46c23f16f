"""Prometheus metrics of the delivery path (docs/operations.md "Metrics"). Processes export
them on /metrics (web) or their own port (commands started with --metrics-port)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from enum import StrEnum
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from apps.occurrences.models import Lane
from apps.occurrences.selectors import lag_reference


def observe_many(histogram: Any, value: float, count: int) -> None:
    """`count` observations of one value, as `count` calls of `observe` would record them, in
    time independent of `count`: the rows of one envelope share their lag, and a 500k burst
    observed row by row held the relay for seconds. Uses the child's bucket and sum values
    as prometheus_client (pinned) keeps them, checked against `observe` by a test."""
    if count == 1:
        histogram.observe(value)
        return
    histogram._raise_if_not_observable()
    histogram._sum.inc(value * count)
    for bound, bucket in zip(histogram._upper_bounds, histogram._buckets, strict=True):
        if value <= bound:
            bucket.inc(count)
            break


LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30, 60, 300, 900, 3600)

schedule_lag_seconds = Histogram(
    "tick_schedule_lag_seconds",
    "enqueued_at - scheduled_for (strict, catch-up) or - available_at (flexible, retry), at "
    "broker confirm",
    ["lane"],
    buckets=LAG_BUCKETS,
)
occurrences_materialized = Counter(
    "tick_occurrences_materialized_total", "Occurrences inserted by the materializer", ["lane"]
)
occurrence_conflicts = Counter(
    "tick_occurrence_unique_conflicts_total",
    "Occurrences the materializer found already present (ON CONFLICT DO NOTHING)",
)
occurrences_missed = Counter(
    "tick_occurrences_missed_total", "Instants recorded or summarised MISSED"
)
published = Counter("tick_published_total", "Messages confirmed by the broker", ["lane"])
publish_failures = Counter(
    "tick_publish_failures_total", "Publishes nacked, returned unroutable or unconfirmed"
)
outbox_backlog = Gauge("tick_outbox_backlog", "Outbox rows seen due by the last relay pass")
duplicate_claims = Counter(
    "tick_duplicate_claims_total", "Deliveries dropped because the occurrence was already claimed"
)
stale_completions = Counter(
    "tick_stale_completions_total", "Completions ignored because the lease token no longer matched"
)
attempts_finished = Counter("tick_attempts_finished_total", "Attempts finished", ["outcome"])
retries_scheduled = Counter("tick_retries_total", "Retries scheduled through the outbox")
dead_occurrences = Counter("tick_dead_total", "Occurrences that went DEAD (the DLQ)")

# Create every lane's series up front: a lane with no traffic shows zeros, not a gap.
for _lane in Lane:
    schedule_lag_seconds.labels(lane=_lane)
    occurrences_materialized.labels(lane=_lane)
    published.labels(lane=_lane)

# --- execution --------------------------------------------------------------------------
# From a fast handover (tens of ms) to a worker pool saturated for minutes; a catch-up
# occurrence, late by design, lands in +Inf.
START_LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300, 600)
start_lag_seconds = Histogram(
    "tick_start_lag_seconds",
    "First attempt's started_at - scheduled_for (strict, catch-up) or - available_at "
    "(flexible), when the claim opens it",
    ["lane"],
    buckets=START_LAG_BUCKETS,
)
# An occurrence is materialized in one of these lanes; the retry lane only carries outbox
# rows, so it has no start-lag series.
for _lane in (Lane.STRICT, Lane.FLEXIBLE, Lane.CATCHUP):
    start_lag_seconds.labels(lane=_lane)


def observe_start_lag(
    lane: str, *, scheduled_for: datetime, available_at: datetime, started_at: datetime
) -> None:
    """How late the occurrence's first attempt started against its lane's lag reference."""
    due = lag_reference(lane, scheduled_for=scheduled_for, available_at=available_at)
    start_lag_seconds.labels(lane=lane).observe((started_at - due).total_seconds())


overlap_skips = Counter(
    "tick_overlap_skipped_total", "Occurrences SKIPPED_OVERLAP at claim", ["policy"]
)
overlap_waits = Counter(
    "tick_overlap_waiting_total", "Claims parked (QUEUE_ONE WAITING) or delayed by overlap"
)
quota_delays = Counter(
    "tick_quota_delayed_total", "Claims delayed through the outbox by Tenant.max_running"
)
retries_refused = Counter(
    "tick_retries_refused_total",
    "Transient failures sent DEAD instead of retried",
    ["reason"],  # attempts | deadline | budget
)
cancels = Counter("tick_cancels_total", "Running occurrences that ended CANCELED cooperatively")
replays = Counter("tick_replays_total", "DEAD occurrences replayed from the DLQ")
backstop_redeliveries = Counter(
    "tick_backstop_redeliveries_total",
    "ENQUEUED occurrences republished (same id) because nothing claimed them within "
    "TICK_REDELIVER_AFTER_S of their last broker confirm: messages the broker lost",
)
webhook_refused = Counter("tick_webhook_refused_total", "Webhook targets refused by the SSRF guard")


class ThrottledBy(StrEnum):
    """The quota that deferred a row: `kind` of tick_tenant_throttled_total."""

    TRIGGER_RATE = "trigger"
    CATCHUP_RATE = "catchup"


tenant_throttled = Counter(
    "tick_tenant_throttled_total",
    "Occurrences deferred by a tenant's trigger-rate or catch-up-rate quota",
    ["kind"],
)
for _quota in ThrottledBy:
    tenant_throttled.labels(kind=_quota)
outbox_parked = Counter(
    "tick_outbox_parked_total",
    "Outbox rows set aside after repeated publish failures (their occurrences go DEAD)",
)

# --- observability ----------------------------------------------------------------------


def _livemax_gauge(
    name: str, documentation: str, label: str | None = None, values: Iterable[str] = ()
) -> Gauge:
    """A gauge that one process sets (the scan in `manage.py reap`, the reconciliation, or a
    process measuring itself); `livemax` keeps it meaningful if it is ever read in
    multiprocess mode. The series of `values` (of `label`) exist from the start: zeros, not
    gaps."""
    gauge = Gauge(name, documentation, [label] if label else [], multiprocess_mode="livemax")
    for value in values:
        gauge.labels(value)
    return gauge


due_backlog = _livemax_gauge(
    "tick_due_backlog",
    "Unparked outbox rows whose available_at falls before now + bucket (overdue included)",
    "bucket",
    ("1m", "5m", "15m"),
)
materialization_lag_seconds = _livemax_gauge(
    "tick_materialization_lag_seconds",
    "How far the earliest ACTIVE next_run_at trails now + planning window (0 = caught up)",
)
outbox_oldest_age_seconds = _livemax_gauge(
    "tick_outbox_oldest_age_seconds",
    "now - available_at of the oldest due, unparked outbox row (0 when none is due)",
)
outbox_rows = _livemax_gauge(
    "tick_outbox_rows", "Outbox rows by status (due, future, parked)", "status"
)
queue_depth = _livemax_gauge(
    "tick_queue_depth", "Ready messages in RabbitMQ, summed per lane", "lane"
)
queue_oldest_age_seconds = _livemax_gauge(
    "tick_queue_oldest_age_seconds",
    "Approximation of the oldest queued message: now - min(enqueued_at) of ENQUEUED "
    "occurrences of the recent lookback (not yet claimed)",
)
stuck = _livemax_gauge(
    "tick_stuck",
    "Stuck-state scan: outbox rows older than the bound, ENQUEUED past the bound, RUNNING "
    "past lease + grace, ACTIVE schedules with next_run_at far in the past",
    "kind",
    ("outbox", "enqueued", "running", "schedules"),
)
stuck_outbox_by_tenant = _livemax_gauge(
    "tick_stuck_outbox_by_tenant",
    "Stuck outbox rows per tenant: the top TICK_METRICS_TOP_TENANTS tenants by count, the rest "
    'summed as tenant="other" (bounded cardinality)',
    "tenant",
)
outage_retries = Counter(
    "tick_outage_retries_total",
    "Iterations or task steps retried because the database or broker was unavailable",
    ["role", "dependency"],
)
worker_requeues = Counter(
    "tick_worker_requeues_total",
    "Messages handed back to the broker because an outage outlasted the worker's retries",
)
lease_takeovers = Counter(
    "tick_shard_lease_takeovers_total",
    "Shard leases taken from another owner after expiry (not free or released ones)",
    ["role"],
)
clock_skew_seconds = _livemax_gauge(
    "tick_clock_skew_seconds",
    "This process's clock minus the database clock (midpoint of the round trip)",
    "process",
)
occurrence_state_seconds = Histogram(
    "tick_occurrence_state_seconds",
    "Time an occurrence spent in a state, observed when it leaves it",
    ["state"],
    buckets=LAG_BUCKETS,
)
reconcile_findings = _livemax_gauge(
    "tick_reconcile_findings",
    "Findings of the last online reconciliation of a recent window, by class",
    "kind",
    ("missing", "unexpected", "stranded"),
)
scan_duration_seconds = Histogram(
    "tick_scan_duration_seconds", "Duration of one stuck-state scan", buckets=LAG_BUCKETS
)


def measure_clock_skew(process: str) -> float:
    """Process clock minus database clock, from one `SELECT clock_timestamp()` round trip."""
    import time

    from django.db import connection

    with connection.cursor() as cursor:
        before = time.time()
        cursor.execute("SELECT extract(epoch FROM clock_timestamp())")
        after = time.time()
        row = cursor.fetchone()
    assert row is not None
    skew = (before + after) / 2 - float(row[0])
    clock_skew_seconds.labels(process=process).set(skew)
    return skew


class TenantLabels:
    """Bounded tenant label for counters observed on a hot path (no query to rank tenants):
    the first `limit` distinct tenants a process sees keep their own label, every later one
    is counted as "other". Cardinality per process <= limit + 1. Gauges computed by a scan
    rank tenants instead (stuck.bounded_tenant_counts: top N by value + "other")."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._known: set[str] = set()

    def __call__(self, tenant: object) -> str:
        key = str(tenant)
        if key in self._known:
            return key
        if len(self._known) < self.limit:
            self._known.add(key)
            return key
        return "other"


fair_share_delays = Counter(
    "tick_fair_share_delayed_total",
    "Claims delayed through the outbox because the tenant held its share of the live worker "
    "slots while another tenant had work waiting",
)
strict_reserve_delays = Counter(
    "tick_strict_reserve_delayed_total",
    "Claims of recovery work (catch-up lane, retries) delayed because recovery held every "
    "slot outside the share reserved for on-time runs (TICK_STRICT_RESERVED_SHARE), in all "
    "or on the claiming worker",
)
deferred_beside_free_slots = Counter(
    "tick_deferred_beside_free_slots_total",
    "Fair-share deferrals of an occurrence waiting longer than TICK_DEFERRAL_ALERT_S while "
    "a live worker slot was free",
)
