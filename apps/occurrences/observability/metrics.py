"""Prometheus metrics of the delivery path (docs/operations.md "Metrics"). Processes export
them on /metrics (web) or their own port (commands started with --metrics-port)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30, 60, 300, 900, 3600)

schedule_lag_seconds = Histogram(
    "tick_schedule_lag_seconds",
    "enqueued_at - scheduled_for (strict) or - available_at (flexible), at broker confirm",
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
for _lane in ("strict", "flexible", "catchup", "retry"):
    schedule_lag_seconds.labels(lane=_lane)
    occurrences_materialized.labels(lane=_lane)
    published.labels(lane=_lane)

# --- execution --------------------------------------------------------------------------
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

tenant_throttled = Counter(
    "tick_tenant_throttled_total",
    "Occurrences deferred by a tenant's trigger-rate or catch-up-rate quota",
    ["kind"],
)
tenant_throttled.labels(kind="trigger")
tenant_throttled.labels(kind="catchup")
outbox_parked = Counter(
    "tick_outbox_parked_total",
    "Outbox rows set aside after repeated publish failures (their occurrences go DEAD)",
)

# --- observability ----------------------------------------------------------------------
# Gauges below are set by one process (the scan in `manage.py reap`, or the process that
# measures itself); `livemax` keeps them meaningful if they are ever read in multiprocess mode.
due_backlog = Gauge(
    "tick_due_backlog",
    "Unparked outbox rows whose available_at falls before now + bucket (overdue included)",
    ["bucket"],
    multiprocess_mode="livemax",
)
for _bucket in ("1m", "5m", "15m"):
    due_backlog.labels(bucket=_bucket)
materialization_lag_seconds = Gauge(
    "tick_materialization_lag_seconds",
    "How far the earliest ACTIVE next_run_at trails now + planning window (0 = caught up)",
    multiprocess_mode="livemax",
)
outbox_oldest_age_seconds = Gauge(
    "tick_outbox_oldest_age_seconds",
    "now - available_at of the oldest due, unparked outbox row (0 when none is due)",
    multiprocess_mode="livemax",
)
outbox_rows = Gauge(
    "tick_outbox_rows", "Outbox rows by status (due, future, parked)", ["status"],
    multiprocess_mode="livemax",
)  # fmt: skip
queue_depth = Gauge(
    "tick_queue_depth", "Ready messages in RabbitMQ, summed per lane", ["lane"],
    multiprocess_mode="livemax",
)  # fmt: skip
queue_oldest_age_seconds = Gauge(
    "tick_queue_oldest_age_seconds",
    "Approximation of the oldest queued message: now - min(enqueued_at) of ENQUEUED "
    "occurrences of the recent lookback (not yet claimed)",
    multiprocess_mode="livemax",
)
stuck = Gauge(
    "tick_stuck",
    "Stuck-state scan: outbox rows older than the bound, ENQUEUED past the bound, RUNNING "
    "past lease + grace, ACTIVE schedules with next_run_at far in the past",
    ["kind"],
    multiprocess_mode="livemax",
)
for _kind in ("outbox", "enqueued", "running", "schedules"):
    stuck.labels(kind=_kind)
stuck_outbox_by_tenant = Gauge(
    "tick_stuck_outbox_by_tenant",
    "Stuck outbox rows per tenant: the top TICK_METRICS_TOP_TENANTS tenants by count, the rest "
    'summed as tenant="other" (bounded cardinality)',
    ["tenant"],
    multiprocess_mode="livemax",
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
clock_skew_seconds = Gauge(
    "tick_clock_skew_seconds",
    "This process's clock minus the database clock (midpoint of the round trip)",
    ["process"],
    multiprocess_mode="livemax",
)
occurrence_state_seconds = Histogram(
    "tick_occurrence_state_seconds",
    "Time an occurrence spent in a state, observed when it leaves it",
    ["state"],
    buckets=LAG_BUCKETS,
)
reconcile_findings = Gauge(
    "tick_reconcile_findings",
    "Findings of the last online reconciliation of a recent window, by class",
    ["kind"],
    multiprocess_mode="livemax",
)
for _kind in ("missing", "unexpected", "stranded"):
    reconcile_findings.labels(kind=_kind)
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
