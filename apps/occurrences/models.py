"""Occurrences, attempts, the dispatch outbox and shard leases (docs/architecture.md "Records").

`Occurrence` and `Attempt` are PostgreSQL tables range-partitioned by day on `scheduled_for`
(created by RunSQL in migration 0001; partitions by `manage.py partitions`). Every unique key
includes `scheduled_for`, as PostgreSQL requires of partitioned tables.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from django.db import models

# Re-exported: the models and their callers name the lane through this module.
from apps.occurrences.lanes import Lane as Lane
from apps.tenants.models import ACTOR_MAX_LENGTH
from apps.tenants.readable import instant_text

# Namespace of occurrence ids; changing it would change every id, so it is a constant.
OCCURRENCE_NAMESPACE = uuid.UUID("6f1c3a52-7d0e-5b8e-9a41-2c7f0e9d4b10")


def occurrence_id_for(schedule_id: uuid.UUID, version: int, scheduled_for: datetime) -> uuid.UUID:
    """Deterministic id: UUIDv5 over (schedule id, version, scheduled_for in UTC).

    The same instant of the same version always gets the same id, so a re-materialization or a
    republish after a crash is recognisable as a duplicate downstream.
    """
    if scheduled_for.tzinfo is None:
        raise ValueError("scheduled_for must be timezone-aware")
    instant = scheduled_for.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return uuid.uuid5(OCCURRENCE_NAMESPACE, f"{schedule_id}:{version}:{instant}")


class Occurrence(models.Model):
    class State(models.TextChoices):
        SCHEDULED = "SCHEDULED", "Scheduled"
        ENQUEUED = "ENQUEUED", "Enqueued"
        RUNNING = "RUNNING", "Running"
        RETRY_WAIT = "RETRY_WAIT", "Waiting to retry"
        SUCCEEDED = "SUCCEEDED", "Succeeded"
        DEAD = "DEAD", "Dead"
        MISSED = "MISSED", "Missed"
        CANCELED = "CANCELED", "Canceled"
        SUPERSEDED = "SUPERSEDED", "Superseded"
        SKIPPED_OVERLAP = "SKIPPED_OVERLAP", "Skipped (overlap)"
        # QUEUE_ONE: parked behind a RUNNING occurrence of the same schedule
        # (docs/decisions.md "Overlap policies").
        WAITING = "WAITING", "Waiting (overlap)"

    class Origin(models.TextChoices):
        """Why the occurrence exists (docs/decisions.md "Run now and backfill")."""

        SCHEDULED = "scheduled", "Scheduled"
        MANUAL = "manual", "Run now"
        BACKFILL = "backfill", "Backfill"

    pk = models.CompositePrimaryKey("id", "scheduled_for")
    id = models.UUIDField()
    scheduled_for = models.DateTimeField()
    # No database FK: a per-row RI check cost the materializer ~half its insert time, and
    # schedules are never deleted (cancel keeps them), so it guarded nothing real.
    schedule = models.ForeignKey(
        "schedules.Schedule",
        on_delete=models.PROTECT,
        db_constraint=False,
        related_name="occurrences",
    )
    schedule_version = models.PositiveIntegerField()
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, db_constraint=False, related_name="+"
    )
    lane = models.CharField(max_length=16, choices=Lane.choices)
    state = models.CharField(max_length=16, choices=State.choices)
    # Flexible precision spreads runs: scheduled_for + H(id) mod window. Strict: = scheduled_for.
    available_at = models.DateTimeField()
    # First broker confirm of a durable publish; the SLO is measured from it.
    enqueued_at = models.DateTimeField(null=True, blank=True)
    # Latest broker confirm of any publish of it (retry, delay, backstop redelivery): the
    # backstop's clock, so a message confirmed a moment ago is never taken for a lost one.
    last_enqueued_at = models.DateTimeField(null=True, blank=True)
    attempt_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    # Execution. db_default: the materializer inserts rows with raw SQL.
    # Attempts made before the last DLQ replay; max attempts counts from here.
    attempt_base = models.PositiveIntegerField(default=0, db_default=0)
    # No retry is scheduled after this instant; NULL = scheduled_for + TICK_RETRY_DEADLINE_S.
    deadline_at = models.DateTimeField(null=True, blank=True)
    # Cooperative cancel of a RUNNING occurrence: the heartbeat sets the handler's flag.
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # Republished by the backstop (redelivery.occurrences_redeliver) after the broker lost
    # its message; the same id each time.
    redelivery_count = models.PositiveIntegerField(default=0, db_default=0)
    last_redelivered_at = models.DateTimeField(null=True, blank=True)
    # A run asked for by someone (run now, backfill) beside the timetable's own; db_default:
    # the materializer's raw insert leaves both out, and adding a column with a constant
    # default to the partitioned table rewrites nothing.
    origin = models.CharField(
        max_length=16, choices=Origin.choices, default=Origin.SCHEDULED, db_default="scheduled"
    )
    # The actor who asked for a manual or backfill run; "" for scheduled ones.
    requested_by = models.CharField(max_length=200, blank=True, default="", db_default="")

    class Meta:
        managed = True
        constraints = [
            # One occurrence per instant and version for each origin: a backfill of an instant
            # that ended MISSED or DEAD sits beside that row. Built per partition, concurrently
            # (migration 0011); the materializer's ON CONFLICT DO NOTHING names no target.
            models.UniqueConstraint(
                fields=["schedule", "schedule_version", "scheduled_for", "origin"],
                name="occurrence_instant_origin_uniq",
            )
        ]
        indexes = [
            # Tenant listings of occurrences by time (API/UI).
            models.Index(fields=["tenant", "scheduled_for"], name="occurrence_tenant_time_idx"),
            # One schedule's latest occurrences across its versions, newest first: the health
            # of the schedule list (apps/occurrences/schedule_health.py, a LATERAL probe per
            # schedule of the page). The unique key leads with the version, so it cannot.
            models.Index(fields=["schedule", "scheduled_for"], name="occurrence_schedule_time_idx"),
            # The backstop of `manage.py reap` (redelivery.occurrences_redeliver): unfinished
            # occurrences by instant; in-flight work only. Neither `state` nor `enqueued_at`
            # is indexed or in the predicate: the relay's record and the claim change only
            # unindexed columns, so with the partitions' free space (PARTITION_FILLFACTOR)
            # they can be HOT updates; only the completion leaves the index
            # (docs/decisions.md "PostgreSQL work per occurrence").
            models.Index(
                fields=["scheduled_for"],
                name="occurrence_open_idx",
                condition=models.Q(finished_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} @ {instant_text(self.scheduled_for)} {self.state}"


class Attempt(models.Model):
    """One delivery/processing try of an occurrence; partitioned like its occurrence."""

    class Outcome(models.TextChoices):
        SUCCEEDED = "SUCCEEDED", "Succeeded"
        RETRY = "RETRY", "Failed, will retry"
        FAILED = "FAILED", "Failed permanently"
        LEASE_EXPIRED = "LEASE_EXPIRED", "Lease expired"
        CANCELED = "CANCELED", "Canceled while running"
        TIMED_OUT = "TIMED_OUT", "Timed out"

    pk = models.CompositePrimaryKey("id", "scheduled_for")
    id = models.UUIDField(default=uuid.uuid4)
    scheduled_for = models.DateTimeField()
    # No FK: PostgreSQL cannot reference the occurrence's composite key from Django's ORM.
    occurrence_id = models.UUIDField()
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, db_constraint=False, related_name="+"
    )
    attempt_no = models.PositiveIntegerField()
    lease_token = models.UUIDField()
    lease_expires_at = models.DateTimeField()
    worker_id = models.CharField(max_length=200)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, blank=True, default="")
    error_class = models.CharField(max_length=200, blank=True, default="")
    error_message = models.TextField(blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["occurrence_id", "scheduled_for", "attempt_no"],
                name="attempt_no_uniq",
            )
        ]
        indexes = [
            # The lease reaper (`manage.py reap`): open attempts by lease expiry. A closed
            # attempt's entry stays until vacuum removes it, so a scan of the whole index reads
            # every attempt closed since (`attempt_open_by_key`).
            models.Index(
                fields=["lease_expires_at"],
                name="attempt_open_lease_idx",
                condition=models.Q(finished_at__isnull=True),
            ),
            # The run-concurrency quota at claim time (execution.occurrence_claim counts a
            # tenant's open attempts on every claim): a probe per partition, not a scan of
            # every open attempt of every tenant.
            models.Index(
                fields=["tenant"],
                name="attempt_open_tenant_idx",
                condition=models.Q(finished_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"attempt {self.attempt_no} of {self.occurrence_id}"


def attempt_open_by_key(alias: str = "") -> str:
    """SQL: the attempt found by its key (`alias`.id, scheduled_for) is still open; the same as
    `finished_at IS NULL`, written so that PostgreSQL cannot match it to the open-attempt
    partial indexes' predicate. Where it can, it plans the lookup as a scan of a whole partial
    index, which holds an entry for every attempt closed since the last vacuum (hundreds under
    load), instead of one probe of the primary key (docs/decisions.md "Attempts found by
    their key")."""
    column = f"{alias}.finished_at" if alias else "finished_at"
    return f"coalesce({column}, 'infinity'::timestamptz) = 'infinity'::timestamptz"


class DispatchOutbox(models.Model):
    """Occurrences waiting to be published. A row leaves only after the broker
    confirmed its publish and `enqueued_at` was recorded in the same transaction."""

    id = models.BigAutoField(primary_key=True)
    occurrence_id = models.UUIDField()
    scheduled_for = models.DateTimeField()
    schedule_id = models.UUIDField()
    schedule_version = models.PositiveIntegerField()
    tenant_id = models.UUIDField()
    shard = models.PositiveSmallIntegerField()
    lane = models.CharField(max_length=16, choices=Lane.choices)
    available_at = models.DateTimeField()
    created_at = models.DateTimeField()
    # Poison handling: failed publishes (unbuildable, nacked, unroutable) back off; after
    # TICK_RELAY_MAX_PUBLISH_ATTEMPTS the row is parked and its occurrence goes DEAD (DLQ),
    # so the rows behind it keep flowing. db_default: rows are inserted by raw SQL.
    publish_attempts = models.PositiveIntegerField(default=0, db_default=0)
    last_error = models.TextField(blank=True, default="", db_default="")
    parked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # The relay's claim (`manage.py relay`): due rows of its shards, oldest first;
            # parked rows drop out of the index. `id` lets the staging of a big instant page
            # through it by id without visiting the rows it has already read
            # (pipeline/staging.py).
            models.Index(
                fields=["shard", "available_at", "id"],
                name="outbox_due_idx",
                condition=models.Q(parked_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"outbox {self.occurrence_id} ({self.lane}) at {instant_text(self.available_at)}"


class ShardLease(models.Model):
    """A renewable lease on one logical shard for one role (materializer or relay).

    `generation` rises at every change of owner: work is fenced by locking this row and
    checking (owner, generation) in the same transaction as the writes it guards.
    """

    class Role(models.TextChoices):
        MATERIALIZER = "materializer", "Materializer"
        RELAY = "relay", "Relay"

    role = models.CharField(max_length=16, choices=Role.choices)
    shard = models.PositiveSmallIntegerField()
    owner = models.CharField(max_length=200, blank=True, default="")
    generation = models.BigIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # Relay rows only: how many schedule changes have recalled outbox rows of this shard
    # (`relay_shard_barrier` adds one). A relay that read a shard's rows ahead of their
    # instant publishes them only if this has not moved since (pipeline/staging.py).
    recalls = models.BigIntegerField(default=0, db_default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["role", "shard"], name="shard_lease_role_shard_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.role} shard {self.shard} -> {self.owner or '-'} (gen {self.generation})"


class WorkerPresence(models.Model):
    """A live Celery worker and its number of slots (pool processes), refreshed by the worker:
    the fair share of slots a tenant may hold is counted over the live ones."""

    hostname = models.CharField(max_length=200, primary_key=True)
    slots = models.PositiveIntegerField()
    seen_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.hostname}: {self.slots} slots, seen {instant_text(self.seen_at)}"


class TenantActivity(models.Model):
    """When a tenant last started an attempt (rewritten at most every few seconds): a tenant
    seen here recently contends for worker slots, so the others are held to their share
    (execution/presence.py). No FK: written on the claim path; a deleted tenant's row ages
    out of every window by itself."""

    tenant_id = models.UUIDField(primary_key=True)
    last_started_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.tenant_id}: last started {instant_text(self.last_started_at)}"


class LeaseMember(models.Model):
    """A live materializer or relay process, refreshed with its leases: fair shares are
    counted over members, so a newcomer holding no shard yet still gets its share."""

    role = models.CharField(max_length=16, choices=ShardLease.Role.choices)
    owner = models.CharField(max_length=200)
    seen_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["role", "owner"], name="lease_member_role_owner_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.role} {self.owner} seen {instant_text(self.seen_at)}"


class HandlerEffect(models.Model):
    """The side effect of the built-in `record` handler: one row per occurrence, however many
    times it is delivered (`deliveries` counts how often the handler ran for it)."""

    occurrence_id = models.UUIDField(primary_key=True)
    tenant_id = models.UUIDField()
    schedule_id = models.UUIDField()
    scheduled_for = models.DateTimeField()
    attempt_no = models.PositiveIntegerField()
    payload = models.JSONField(default=dict)
    first_run_at = models.DateTimeField()
    deliveries = models.PositiveIntegerField(default=1)

    def __str__(self) -> str:
        return f"effect of {self.occurrence_id} x{self.deliveries}"


class RetryBudget(models.Model):
    """A tenant's retries in one fixed UTC hour (docs/decisions.md "Retries by error class"):
    `attempt_complete` increments `used` with a conditional upsert and sends the occurrence
    DEAD once the tenant's `retry_budget_per_hour` is spent. Old windows are deleted by the
    reaper."""

    tenant_id = models.UUIDField()
    window_start = models.DateTimeField()
    used = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant_id", "window_start"], name="retry_budget_window_uniq"
            )
        ]

    def __str__(self) -> str:
        return f"retries of {self.tenant_id} from {instant_text(self.window_start)}: {self.used}"


class TenantRateBucket(models.Model):
    """A tenant's trigger-rate or catch-up-rate token bucket, shared by every relay process
    (docs/decisions.md "Quotas in the relay"): `pipeline/throttle.py` takes a step's tokens
    for all tenants of its batch in one upsert. `tokens` may be negative: tokens reserved
    for deferred rows."""

    tenant_id = models.UUIDField()
    kind = models.CharField(max_length=16)  # metrics.ThrottledBy
    rate = models.FloatField()
    tokens = models.FloatField()
    stamp = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant_id", "kind"], name="rate_bucket_tenant_kind_uniq"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} bucket of {self.tenant_id}: {self.tokens:.1f}/{self.rate:g}"


class AlertChannel(models.Model):
    """Where a tenant's alerts go: an e-mail address or a webhook URL (docs/alerts.md)."""

    class Kind(models.TextChoices):
        EMAIL = "email", "E-mail"
        WEBHOOK = "webhook", "Webhook"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    target = models.CharField(max_length=2048)  # the address or the URL
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # When the channel last received a message: at most one per TICK_ALERT_CHANNEL_INTERVAL_S,
    # whatever fired meanwhile goes into the next one as a digest.
    last_sent_at = models.DateTimeField(null=True, blank=True)
    # An e-mail channel receives alerts only once someone followed the link mailed to its
    # address (alerts/configure.py); webhooks are confirmed when made. NULL = pending.
    confirmed_at = models.DateTimeField(null=True, blank=True)
    # sha256 of the secret in the last confirmation link; "" once confirmed.
    confirmation_token_hash = models.CharField(max_length=64, blank=True, default="")
    confirmation_sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tenant", "name", "id"]
        indexes = [models.Index(fields=["tenant", "name"], name="alert_channel_tenant_idx")]

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"

    @property
    def confirmation(self) -> str:
        """ "confirmed", or "pending" while an e-mail address has not confirmed it."""
        return "confirmed" if self.confirmed_at is not None else "pending"


class AlertEvent(models.TextChoices):
    OCCURRENCE_DEAD = "occurrence_dead", "An occurrence went DEAD"
    OCCURRENCE_MISSED = "occurrence_missed", "An occurrence was MISSED"
    START_LAG = "start_lag", "Start lag above a threshold"
    ENQUEUE_LAG = "enqueue_lag", "Enqueue lag above a threshold"
    SCHEDULE_COMPLETED = "schedule_completed", "A schedule completed"
    SCHEDULE_PAUSED_FAILING = (
        "schedule_paused_failing",
        "A schedule was paused after consecutive DEAD runs",
    )
    # Sent by the "send test alert" button only; no rule names it.
    TEST = "test", "Test alert"


RULE_EVENTS = tuple(event for event in AlertEvent if event != AlertEvent.TEST)
LAG_EVENTS = (AlertEvent.START_LAG, AlertEvent.ENQUEUE_LAG)


class AlertRule(models.Model):
    """One kind of event sent to one channel, for every schedule or for one."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    channel = models.ForeignKey(AlertChannel, on_delete=models.CASCADE, related_name="rules")
    event = models.CharField(max_length=32, choices=[(e.value, e.label) for e in RULE_EVENTS])
    # NULL: every schedule of the tenant.
    schedule = models.ForeignKey(
        "schedules.Schedule",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        db_constraint=False,
        related_name="+",
    )
    # Lag rules: fire when the lag stays above threshold_s for window_minutes.
    threshold_s = models.PositiveIntegerField(null=True, blank=True)
    window_minutes = models.PositiveIntegerField(null=True, blank=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant", "event", "id"]
        indexes = [
            models.Index(fields=["tenant", "event"], name="alert_rule_tenant_event_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.event} -> {self.channel_id}"


class AlertDelivery(models.Model):
    """One message to one channel: a single alert, or a digest of the alerts that fired while
    the channel was rate-limited. Published to RabbitMQ as a task and sent by a worker; its id
    is the `Tick-Alert-Id` a receiver deduplicates on."""

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        SENT = "sent", "Sent"
        FAILED = "failed", "Failed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    channel = models.ForeignKey(AlertChannel, on_delete=models.CASCADE, related_name="deliveries")
    alert_count = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    created_at = models.DateTimeField()
    # First broker confirm of its task message; NULL = the dispatcher publishes it (again),
    # not before `available_at` (a failed send backs off this way: Tick sends no ETA tasks).
    published_at = models.DateTimeField(null=True, blank=True)
    available_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    # Set while a worker sends it (the send's deadline plus a margin, so a worker that died
    # frees the slot by itself): the tenant's sends in flight are capped (deliver.py).
    sending_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "id"]
        indexes = [
            models.Index(fields=["tenant", "created_at"], name="alert_delivery_tenant_idx"),
            models.Index(
                fields=["available_at"],
                name="alert_delivery_unpublished_idx",
                condition=models.Q(published_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"delivery {self.id} ({self.alert_count}) {self.state}"


class Alert(models.Model):
    """An event a rule matched. Its id is deterministic (rule + subject), so recording the
    same event twice (a redelivered completion, a re-run pass) stores it once."""

    id = models.UUIDField(primary_key=True)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, null=True, related_name="+")
    channel = models.ForeignKey(AlertChannel, on_delete=models.CASCADE, related_name="alerts")
    event = models.CharField(max_length=32, choices=AlertEvent.choices)
    schedule_id = models.UUIDField(null=True, blank=True)
    occurrence_id = models.UUIDField(null=True, blank=True)
    subject = models.CharField(max_length=300)
    detail = models.JSONField(default=dict, blank=True)
    fired_at = models.DateTimeField()
    delivery = models.ForeignKey(
        AlertDelivery, on_delete=models.SET_NULL, null=True, blank=True, related_name="alerts"
    )

    class Meta:
        ordering = ["-fired_at", "id"]
        indexes = [
            models.Index(fields=["tenant", "fired_at"], name="alert_tenant_fired_idx"),
            # The dispatcher's work: alerts not yet in a delivery.
            models.Index(
                fields=["channel", "fired_at"],
                name="alert_undelivered_idx",
                condition=models.Q(delivery__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event}: {self.subject}"


class BulkChange(models.Model):
    """One bulk pause / resume / cancel / run now over a tenant's schedules, worked in
    bounded batches by `manage.py bulk` (apps/occurrences/bulk_changes.py): each schedule's
    change is the single verb's, in a short transaction (one per run of schedules with nothing
    to recall, one per schedule with a recall) which also advances this row (cursor and
    totals), so a restart resumes after the last schedule counted."""

    class Verb(models.TextChoices):
        PAUSE = "pause", "Pause"
        RESUME = "resume", "Resume"
        CANCEL = "cancel", "Cancel"
        RUN_NOW = "run_now", "Run now"

    class State(models.TextChoices):
        RUNNING = "RUNNING", "Running"
        DONE = "DONE", "Done"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT)
    verb = models.CharField(max_length=16, choices=Verb.choices)
    actor = models.CharField(max_length=ACTOR_MAX_LENGTH)
    # {"ids": [...]} or {"filter": {"state", "kind", "handler", "q", "label": [[k, v]]}}.
    selection = models.JSONField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.RUNNING)
    matched = models.PositiveIntegerField(default=0)
    changed = models.PositiveIntegerField(default=0)
    already = models.PositiveIntegerField(default=0)
    refused = models.PositiveIntegerField(default=0)
    # Why each refused schedule was refused: [{"id", "code", "message"}], the first 1000.
    refusals = models.JSONField(default=list, blank=True)
    # Keyset cursor over (created_at, id) descending: the last schedule counted.
    after_created_at = models.DateTimeField(null=True, blank=True)
    after_id = models.UUIDField(null=True, blank=True)
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["created_at"],
                name="bulkchange_running_idx",
                condition=models.Q(state="RUNNING"),
            ),  # fmt: skip
            models.Index(fields=["tenant", "-created_at"], name="bulkchange_tenant_idx"),
        ]

    def __str__(self) -> str:
        return f"bulk {self.verb} {self.id} ({self.state})"
