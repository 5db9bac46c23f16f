"""Prometheus metrics of the delivery path (SPEC §9). Processes export them on /metrics
(web) or their own port (commands started with --metrics-port)."""

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

# --- execution (issue 6) ----------------------------------------------------------------
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
