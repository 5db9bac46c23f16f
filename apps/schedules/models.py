"""Schedules: *when* and *what*, every version kept, every change logged
(docs/architecture.md "Records").
"""

from __future__ import annotations

import hashlib
import uuid

from django.contrib.postgres.indexes import GinIndex, OpClass
from django.db import models
from django.db.models import JSONField, Value
from django.db.models.functions import Upper

from apps.schedules import rule_options
from apps.tenants.models import ACTOR_MAX_LENGTH, Tenant


class Schedule(models.Model):
    class Kind(models.TextChoices):
        ONE_SHOT = "ONE_SHOT", "One-shot"
        CRON = "CRON", "Cron"
        INTERVAL = "INTERVAL", "Fixed rate"

    class State(models.TextChoices):
        ACTIVE = "ACTIVE", "Active"
        PAUSED = "PAUSED", "Paused"
        CANCELED = "CANCELED", "Canceled"
        COMPLETED = "COMPLETED", "Completed"

    class Precision(models.TextChoices):
        STRICT = "STRICT", "Strict"
        FLEXIBLE = "FLEXIBLE", "Flexible"

    class MisfirePolicy(models.TextChoices):
        SKIP = "SKIP", "Skip"
        FIRE_ONCE = "FIRE_ONCE", "Fire once"
        CATCHUP = "CATCHUP", "Catch up"

    class OverlapPolicy(models.TextChoices):
        ALLOW = "ALLOW", "Allow"
        SKIP_IF_RUNNING = "SKIP_IF_RUNNING", "Skip if running"
        QUEUE_ONE = "QUEUE_ONE", "Queue one"

    # The DST options live beside the time rules, which import nothing from Django.
    DstGap = rule_options.DstGap
    DstFold = rule_options.DstFold

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: every index below except the due scan's leads with tenant_id, and
    # each advance of next_run_at (non-HOT: next_run_at is indexed) wrote one more entry
    # into it (docs/decisions.md "Fewer schedule index writes").
    tenant = models.ForeignKey(
        Tenant, on_delete=models.PROTECT, related_name="schedules", db_index=False
    )
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    expression = models.CharField(max_length=200, blank=True, default="")
    run_at = models.DateTimeField(null=True, blank=True)
    # A fixed-rate schedule's period in seconds; its instants are start_at + k * interval_s
    # (elapsed time, never moved by DST: docs/timerules.md "Fixed-rate schedules").
    interval_s = models.PositiveIntegerField(null=True, blank=True)
    # Kept as given (IANA name); wall-clock evaluation happens only in timerules/.
    time_zone = models.CharField(max_length=64, default="UTC")
    dst_gap = models.CharField(max_length=8, choices=DstGap.choices, default=DstGap.SKIP.value)
    dst_fold = models.CharField(max_length=8, choices=DstFold.choices, default=DstFold.FIRST.value)
    start_at = models.DateTimeField(null=True, blank=True)
    end_at = models.DateTimeField(null=True, blank=True)

    precision = models.CharField(max_length=16, choices=Precision.choices, default="STRICT")
    flexible_window_s = models.PositiveIntegerField(default=0)
    misfire_policy = models.CharField(
        max_length=16, choices=MisfirePolicy.choices, default=MisfirePolicy.FIRE_ONCE
    )
    max_lateness_s = models.PositiveIntegerField(default=60)
    catchup_limit = models.PositiveIntegerField(default=0)
    overlap_policy = models.CharField(
        max_length=16, choices=OverlapPolicy.choices, default=OverlapPolicy.ALLOW
    )
    handler = models.CharField(max_length=100)
    payload = models.JSONField(default=dict, blank=True)
    # Run-time limit of one attempt; NULL = the handler's default (execution/registry.py).
    timeout_s = models.PositiveIntegerField(null=True, blank=True)
    # `key=value` labels (apps/schedules/labels.py): not part of the definition, so a change
    # of labels makes no version.
    # The database default too: bulk loaders and benchmarks insert rows with raw SQL.
    labels = models.JSONField(default=dict, db_default=Value({}, JSONField()), blank=True)
    # Pause after this many consecutive DEAD occurrences (0 = never); the tenant's default at
    # create (`Tenant.pause_after_dead`). Not part of the definition, like the labels.
    pause_after_dead = models.PositiveSmallIntegerField(default=0, db_default=0)
    # Consecutive DEAD occurrences so far: counted by the completion only while the setting
    # is on, reset by a success and by resume (apps/occurrences/failure_pause.py).
    dead_streak = models.PositiveIntegerField(default=0, db_default=0)

    # Server-owned: never mass-assigned from the API.
    version = models.PositiveIntegerField(default=1)
    state = models.CharField(max_length=16, choices=State.choices, default=State.ACTIVE)
    # Next instant not yet materialized (UTC); NULL when nothing remains to fire.
    next_run_at = models.DateTimeField(null=True, blank=True)
    shard = models.PositiveSmallIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [
            # The materializer's due scan (`manage.py materialize`): per shard, oldest first,
            # active schedules only, so paused/canceled/completed rows cost nothing at 20M.
            models.Index(
                fields=["shard", "next_run_at"],
                name="schedule_due_idx",
                condition=models.Q(state="ACTIVE", next_run_at__isnull=False),
            ),
            # Tenant listings (API/UI), newest first with id as the cursor tie-breaker.
            models.Index(fields=["tenant", "-created_at", "-id"], name="schedule_tenant_list_idx"),
            # GET /api/v1/schedules?state=… (keyset pages per state) and the active-schedule
            # quota count in schedule_create (tenant, state IN (ACTIVE, PAUSED)).
            models.Index(
                fields=["tenant", "state", "-created_at", "-id"],
                name="schedule_tenant_state_idx",
            ),
            # GET /api/v1/schedules?handler=…: keyset pages per handler.
            models.Index(
                fields=["tenant", "handler", "-created_at", "-id"],
                name="schedule_tenant_handler_idx",
            ),
            # GET /api/v1/schedules?q=…: `name ILIKE %q%` (Django's icontains compiles to
            # UPPER(name) LIKE UPPER(…)) through a trigram index instead of a table scan.
            # Created by explicit SQL in migration 0002 (Django renders this OpClass badly).
            GinIndex(OpClass(Upper("name"), name="gin_trgm_ops"), name="schedule_name_trgm_idx"),
            # The reaper's scan for schedules due a pause after consecutive DEAD occurrences
            # (apps/occurrences/failure_pause.py): holds only those, normally none.
            models.Index(
                fields=["id"],
                name="schedule_failing_streak_idx",
                condition=models.Q(
                    state="ACTIVE",
                    pause_after_dead__gt=0,
                    dead_streak__gte=models.F("pause_after_dead"),
                ),
            ),  # fmt: skip
            # GET /api/v1/schedules?label=k=v: `labels @> {"k": "v"}` (docs/decisions.md
            # "Labels"); jsonb_path_ops holds one hash per pair, smaller than jsonb_ops.
            # Partial: a schedule without labels has no entry (GIN would store an empty-item
            # one), so its advance writes none; the filter says `labels <> '{}'` to use it
            # (selectors.schedules_filtered; docs/decisions.md "Delivery path: fewer writes
            # per occurrence").
            GinIndex(
                fields=["labels"],
                opclasses=["jsonb_path_ops"],
                name="schedule_labels_idx",
                condition=~models.Q(labels={}),
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(flexible_window_s__lte=300), name="schedule_window_le_300"
            ),
            models.CheckConstraint(
                condition=models.Q(end_at__isnull=True)
                | models.Q(start_at__isnull=True)
                | models.Q(end_at__gt=models.F("start_at")),
                name="schedule_end_after_start",
            ),
            # A fixed rate needs its period and its anchor; the bounds are timerules'.
            models.CheckConstraint(
                condition=~models.Q(kind="INTERVAL")
                | models.Q(
                    interval_s__gte=60, interval_s__lte=366 * 86_400, start_at__isnull=False
                ),
                name="schedule_interval_defined",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind} v{self.version})"


class ScheduleVersion(models.Model):
    """One version of a schedule's definition and the interval it was in force.

    `definition` holds the fields that decide future runs, as they were for this version; the
    reconciliation audit recomputes expected occurrences from it.
    """

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="versions")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT)
    version = models.PositiveIntegerField()
    definition = models.JSONField()
    valid_from = models.DateTimeField()
    valid_to = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["schedule", "version"], name="schedule_version_uniq")
        ]
        ordering = ["schedule", "version"]

    def __str__(self) -> str:
        return f"{self.schedule_id} v{self.version}"


class ScheduleEvent(models.Model):
    """Append-only audit log of lifecycle changes, with who did it."""

    class Kind(models.TextChoices):
        CREATED = "created", "Created"
        UPDATED = "updated", "Updated"
        PAUSED = "paused", "Paused"
        RESUMED = "resumed", "Resumed"
        CANCELED = "canceled", "Canceled"
        COMPLETED = "completed", "Completed"
        MISSED = "missed", "Missed (summary)"
        RUN_NOW = "run_now", "Run now"
        BACKFILLED = "backfilled", "Backfill"

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="events")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    version = models.PositiveIntegerField()
    actor = models.CharField(max_length=ACTOR_MAX_LENGTH)
    at = models.DateTimeField()
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [models.Index(fields=["schedule", "at"], name="schedule_event_at_idx")]
        ordering = ["schedule", "at", "id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.schedule_id} v{self.version} by {self.actor}"


def shard_for(schedule_id: uuid.UUID, shards: int) -> int:
    """Stable H(schedule_id) mod N: the same in every process and after restarts."""
    digest = hashlib.blake2b(schedule_id.bytes, digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards
