"""Schedule state transitions. Each writes its version row and audit event in the same
transaction as the change it records (no signals).

Update, pause and cancel share one concurrency story (`_recall`), run while the schedule row
is locked `FOR UPDATE`:
1. The lock serialises with the materializer, whose due scan is `FOR UPDATE SKIP LOCKED`: a
   batch holding the row finishes first (its occurrences are then visible here); a later
   batch skips the row until commit and then reads the new version / state.
2. `relay_shard_barrier(shard)` takes the shard's relay lease row FOR UPDATE: a relay step
   holds it FOR SHARE from its outbox read until its last publish, so this waits for a step
   in flight and holds off the next one. Then the outbox rows of the affected occurrences are
   deleted. Rows the relay already recorded are gone (ENQUEUED: reported not recalled); rows
   published but not yet recorded are invalidated here, and the worker's claim drops their
   message (version / cancellation re-check). Nothing affected is published after commit.
   The relay never locks schedules and this code touches occurrences only after the
   barrier, so the two cannot deadlock.
3. The occurrences whose outbox row was deleted and that are still SCHEDULED (or RETRY_WAIT,
   for update and cancel) become SUPERSEDED / CANCELED in the same statement: set-based, no
   per-row saves.
4. What could not be recalled (in flight, or at/after the change and already finished) is
   read back for the receipt.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.occurrences.pipeline.leases import relay_shard_barrier
from apps.schedules import timerules
from apps.schedules.errors import QuotaExceeded, RuleTooFrequent, StateConflict
from apps.schedules.models import Schedule, ScheduleEvent, ScheduleVersion, shard_for
from apps.tenants.models import Tenant

# Schedules that count against `Tenant.max_active_schedules`: a paused one can be resumed
# without asking for capacity again.
QUOTA_STATES = (Schedule.State.ACTIVE, Schedule.State.PAUSED)
# Rule-frequency check: 1441 consecutive fires always span every minute-of-day position of a
# cron rule once (a day has 1440 minutes), so their smallest gap is the rule's smallest gap.
_INTERVAL_SAMPLE = 1441
# Receipts list at most this many occurrences per kind (ordered by instant).
RECEIPT_LIMIT = 1000

# Fields whose change alters future runs; they are what a ScheduleVersion records.
DEFINITION_FIELDS = (
    "kind",
    "expression",
    "run_at",
    "time_zone",
    "dst_gap",
    "dst_fold",
    "start_at",
    "end_at",
    "precision",
    "flexible_window_s",
    "misfire_policy",
    "max_lateness_s",
    "catchup_limit",
    "overlap_policy",
    "handler",
    "payload",
)


@dataclass(frozen=True)
class ScheduleSpec:
    """A validated schedule definition, as the API or a form hands it to the services."""

    name: str
    kind: str
    time_zone: str
    handler: str
    expression: str = ""
    run_at: datetime | None = None
    dst_gap: str = Schedule.DstGap.SKIP
    dst_fold: str = Schedule.DstFold.FIRST
    start_at: datetime | None = None
    end_at: datetime | None = None
    precision: str = Schedule.Precision.STRICT
    flexible_window_s: int = 0
    misfire_policy: str = Schedule.MisfirePolicy.FIRE_ONCE
    max_lateness_s: int = 60
    catchup_limit: int = 0
    overlap_policy: str = Schedule.OverlapPolicy.ALLOW
    payload: Any = None


class Timing(Protocol):
    """The fields that decide *when* a schedule fires: a saved `Schedule` or a `ScheduleSpec`."""

    @property
    def kind(self) -> str: ...

    @property
    def expression(self) -> str: ...

    @property
    def run_at(self) -> datetime | None: ...

    @property
    def time_zone(self) -> str: ...

    @property
    def dst_gap(self) -> str: ...

    @property
    def dst_fold(self) -> str: ...

    @property
    def start_at(self) -> datetime | None: ...

    @property
    def end_at(self) -> datetime | None: ...


def first_run_at(*, timing: Timing, now: datetime) -> datetime | None:
    """The first instant to materialize for a new definition, or None if none remains."""
    if timing.kind == Schedule.Kind.ONE_SHOT:
        return timing.run_at
    return timerules.next_fire_time(
        timing.expression,
        timing.time_zone,
        now,
        dst_gap=timing.dst_gap,
        dst_fold=timing.dst_fold,
        start_at=timing.start_at,
        end_at=timing.end_at,
    )


def _definition(schedule: Schedule) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for name in DEFINITION_FIELDS:
        value = getattr(schedule, name)
        data[name] = value.isoformat() if isinstance(value, datetime) else value
    return data


def rule_min_gap_s(*, expression: str) -> int | None:
    """Smallest gap in seconds between consecutive fires of a cron rule on the wall clock, or
    None if it fires at most once. Evaluated in UTC: DST transitions can shorten one gap by
    the DST delta twice a year, which the quota deliberately ignores."""
    fires = timerules.next_fire_times(
        expression, "UTC", datetime(2000, 1, 1, tzinfo=UTC), _INTERVAL_SAMPLE
    )
    gaps = [(b - a).total_seconds() for a, b in zip(fires, fires[1:], strict=False)]
    return int(min(gaps)) if gaps else None


def _check_rule_interval(*, tenant: Tenant, kind: str, expression: str) -> None:
    if kind != Schedule.Kind.CRON:
        return
    gap = rule_min_gap_s(expression=expression)
    if gap is not None and gap < tenant.min_interval_s:
        raise RuleTooFrequent(
            f"The rule fires {gap} s apart at its closest; this tenant allows at least "
            f"{tenant.min_interval_s} s between fires.",
            field="expression",
        )


def _lock_tenant_with_capacity(*, tenant: Tenant) -> Tenant:
    """Lock the tenant row and check the active-schedule quota.

    The row lock serialises concurrent creates (and reactivations) of one tenant, so the
    count below is exact: N racing creates at the quota edge admit exactly the free slots.
    """
    locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
    active = Schedule.objects.filter(tenant=locked, state__in=QUOTA_STATES).count()
    if active >= locked.max_active_schedules:
        raise QuotaExceeded(
            f"This tenant has {active} active or paused schedules, its quota is "
            f"{locked.max_active_schedules}. Cancel one or ask an operator to raise the quota."
        )
    return locked


@transaction.atomic
def schedule_create(*, tenant: Tenant, spec: ScheduleSpec, actor: str) -> Schedule:
    """Create an ACTIVE schedule, its version 1 and its `created` event.

    The spec must already be validated (serializer/form, which call timerules). The first
    `next_run_at` is computed here so the materializer finds the schedule in its due index.
    Tenant quotas (rule frequency, active schedules) are checked here, under the tenant lock.
    """
    tenant = _lock_tenant_with_capacity(tenant=tenant)
    _check_rule_interval(tenant=tenant, kind=spec.kind, expression=spec.expression)
    now = timezone.now()
    schedule_id = uuid.uuid4()
    next_run_at = first_run_at(timing=spec, now=now)
    schedule = Schedule.objects.create(
        id=schedule_id,
        tenant=tenant,
        name=spec.name,
        kind=spec.kind,
        expression=spec.expression,
        run_at=spec.run_at,
        time_zone=spec.time_zone,
        dst_gap=spec.dst_gap,
        dst_fold=spec.dst_fold,
        start_at=spec.start_at,
        end_at=spec.end_at,
        precision=spec.precision,
        flexible_window_s=spec.flexible_window_s,
        misfire_policy=spec.misfire_policy,
        max_lateness_s=spec.max_lateness_s,
        catchup_limit=spec.catchup_limit,
        overlap_policy=spec.overlap_policy,
        handler=spec.handler,
        payload=spec.payload if spec.payload is not None else {},
        version=1,
        state=Schedule.State.ACTIVE if next_run_at is not None else Schedule.State.COMPLETED,
        next_run_at=next_run_at,
        shard=shard_for(schedule_id, settings.TICK_SHARDS),
    )
    ScheduleVersion.objects.create(
        schedule=schedule,
        tenant=tenant,
        version=1,
        definition=_definition(schedule),
        valid_from=now,
    )
    ScheduleEvent.objects.create(
        schedule=schedule,
        tenant=tenant,
        kind=ScheduleEvent.Kind.CREATED,
        version=1,
        actor=actor,
        at=now,
        detail={"next_run_at": next_run_at.isoformat() if next_run_at else None},
    )
    return schedule


def schedule_preview(
    *, timing: Timing, after: datetime, count: int
) -> list[timerules.PreviewEntry]:
    """The next `count` fires after `after` (UTC and local, with DST notes)."""
    if timing.kind == Schedule.Kind.ONE_SHOT:
        if timing.run_at is None or timing.run_at <= after:
            return []
        return [timerules.preview_one_shot(timing.run_at, timing.time_zone)]
    return timerules.preview(
        timing.expression,
        timing.time_zone,
        after,
        count,
        dst_gap=timing.dst_gap,
        dst_fold=timing.dst_fold,
        start_at=timing.start_at,
        end_at=timing.end_at,
    )


def schedule_preview_saved(
    *, schedule: Schedule, count: int, now: datetime
) -> list[timerules.PreviewEntry]:
    """Preview of a saved schedule: from its next unmaterialized instant (or now)."""
    if schedule.state in (Schedule.State.CANCELED, Schedule.State.COMPLETED):
        return []
    after = now
    if schedule.next_run_at is not None and schedule.next_run_at <= now:
        after = schedule.next_run_at - timedelta(microseconds=1)
    return schedule_preview(timing=schedule, after=after, count=count)


# --------------------------------------------------------------------------------------------
# Lifecycle: update, pause, resume, cancel (module docstring, steps 1-4)
# --------------------------------------------------------------------------------------------

# Occurrence states (apps.occurrences.models.Occurrence.State), as the SQL below uses them.
_SCHEDULED, _RETRY_WAIT = "SCHEDULED", "RETRY_WAIT"
_SUPERSEDED, _CANCELED = "SUPERSEDED", "CANCELED"
_IN_FLIGHT = ["ENQUEUED", "RUNNING", "RETRY_WAIT"]
_FINISHED = ["SUCCEEDED", "DEAD", "SKIPPED_OVERLAP"]
_RETRY_LANE = "retry"


@dataclass(frozen=True)
class NotRecalled:
    """An affected occurrence already handed to the queue (or run): it cannot be pulled back.
    The worker's claim still re-checks version and cancellation before the handler runs."""

    id: uuid.UUID
    state: str
    scheduled_for: datetime
    schedule_version: int


@dataclass(frozen=True)
class Receipt:
    """What a lifecycle change actually did, decided in the transaction that made it."""

    action: str
    at: datetime
    version: int
    invalidated: list[uuid.UUID] = field(default_factory=list)
    # SUPERSEDED (update) or CANCELED (pause, cancel); None when nothing was invalidated.
    invalidated_state: str | None = None
    not_recalled: list[NotRecalled] = field(default_factory=list)


@dataclass(frozen=True)
class LifecycleResult:
    schedule: Schedule
    receipt: Receipt


# Steps 2 and 3 in one statement, after `relay_shard_barrier`: rows a relay already published
# (and deleted) are not in `gone`; rows published but not yet recorded are, and their
# occurrences are dropped by the worker's claim (version/cancel re-check). `shard` narrows the scan
# to the schedule's shard through outbox_due_idx.
_RECALL = """
    WITH gone AS (
        DELETE FROM occurrences_dispatchoutbox
        WHERE shard = %(shard)s AND schedule_id = %(schedule)s
          AND schedule_version < %(below)s AND NOT (lane = ANY(%(keep_lanes)s::text[]))
        RETURNING occurrence_id, scheduled_for
    )
    UPDATE occurrences_occurrence o
    SET state = %(to_state)s, finished_at = %(now)s
    FROM gone
    WHERE o.id = gone.occurrence_id AND o.scheduled_for = gone.scheduled_for
      AND o.schedule_id = %(schedule)s AND o.state = ANY(%(from_states)s::text[])
    RETURNING o.id, o.scheduled_for
"""

# Step 4: in flight (may still run), or at/after the change instant and already finished.
_NOT_RECALLED = """
    SELECT id, state, scheduled_for, schedule_version
    FROM occurrences_occurrence
    WHERE schedule_id = %(schedule)s AND schedule_version < %(below)s
      AND scheduled_for >= %(since)s
      AND (state = ANY(%(in_flight)s::text[])
           OR (scheduled_for >= %(now)s AND state = ANY(%(finished)s::text[])))
    ORDER BY scheduled_for, id
    LIMIT %(limit)s
"""

# The latest future instant older versions produced and kept (published, running, finished):
# the new version starts after it, so no instant fires twice across versions.
_LATEST_KEPT = """
    SELECT max(scheduled_for) FROM occurrences_occurrence
    WHERE schedule_id = %(schedule)s AND schedule_version < %(below)s
      AND scheduled_for >= %(now)s AND NOT (state = ANY(%(dropped)s::text[]))
"""


def _lock(schedule: Schedule) -> Schedule:
    return Schedule.objects.select_for_update().get(pk=schedule.pk, tenant_id=schedule.tenant_id)


def _recall(
    *,
    schedule: Schedule,
    below: int,
    keep_lanes: list[str],
    from_states: list[str],
    to_state: str,
    now: datetime,
) -> list[uuid.UUID]:
    # Wait for (and hold off) the relay step in flight on this shard: what is deleted
    # below can then no longer be published after this transaction commits.
    relay_shard_barrier(schedule.shard)
    with connection.cursor() as cursor:
        cursor.execute(_RECALL, {
            "shard": schedule.shard, "schedule": schedule.id, "below": below,
            "keep_lanes": keep_lanes, "from_states": from_states, "to_state": to_state,
            "now": now,
        })  # fmt: skip
        rows = sorted(cursor.fetchall(), key=lambda r: (r[1], r[0]))
    return [row[0] for row in rows]


def _not_recalled(*, schedule: Schedule, below: int, now: datetime) -> list[NotRecalled]:
    with connection.cursor() as cursor:
        cursor.execute(_NOT_RECALLED, {
            "schedule": schedule.id, "below": below, "now": now,
            "since": now - timedelta(seconds=settings.TICK_RECEIPT_LOOKBACK_S),
            "in_flight": _IN_FLIGHT, "finished": _FINISHED, "limit": RECEIPT_LIMIT,
        })  # fmt: skip
        return [NotRecalled(*row) for row in cursor.fetchall()]


def _latest_kept(*, schedule: Schedule, below: int, now: datetime) -> datetime | None:
    with connection.cursor() as cursor:
        cursor.execute(_LATEST_KEPT, {
            "schedule": schedule.id, "below": below, "now": now,
            "dropped": [_SUPERSEDED, _CANCELED],
        })  # fmt: skip
        row = cursor.fetchone()
    return row[0] if row else None


def _log(schedule: Schedule, kind: str, actor: str, now: datetime, **detail: Any) -> None:
    ScheduleEvent.objects.create(
        schedule=schedule,
        tenant_id=schedule.tenant_id,
        kind=kind,
        version=schedule.version,
        actor=actor,
        at=now,
        detail=detail,
    )


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _differs(current: Any, wanted: Any) -> bool:
    return bool(current != wanted)


def _next_for_new_version(
    *, spec: ScheduleSpec, floor: datetime, kept: datetime | None
) -> datetime | None:
    """First instant of the new definition after `floor` (a one-shot keeps its run_at, even a
    slightly late one, unless an older version already produced that instant or a later one)."""
    if spec.kind == Schedule.Kind.ONE_SHOT:
        if spec.run_at is None or (kept is not None and spec.run_at <= kept):
            return None
        return spec.run_at
    return first_run_at(timing=spec, now=floor)


def schedule_update(*, schedule: Schedule, spec: ScheduleSpec, actor: str) -> LifecycleResult:
    """Apply a validated full definition (the PATCH merged onto `schedule` as read).

    1. Lock the row; if another change committed since `schedule` was read (version or name
       differ), refuse (409) rather than overwrite it with stale merged fields.
    2. Only the name changed: rename, no new version, no occurrence touched.
    3. Definition changed: version + 1; older versions' unpublished occurrences become
       SUPERSEDED and their outbox rows go (module docstring); `next_run_at` is the new rule's
       first instant after max(now, latest instant an older version kept), so the new
       version re-fires only instants whose old occurrence was superseded here.
    4. Close the previous version's interval, open the new one, log `updated`.
    """
    now = timezone.now()
    payload = spec.payload if spec.payload is not None else {}
    with transaction.atomic():
        locked = _lock(schedule)
        if locked.version != schedule.version or locked.name != schedule.name:
            raise StateConflict(
                "The schedule changed while this update was being prepared; read it and retry."
            )
        if locked.state == Schedule.State.CANCELED:
            raise StateConflict("A canceled schedule cannot be updated; create a new one.")
        wanted = {name: getattr(spec, name) for name in DEFINITION_FIELDS}
        wanted["payload"] = payload
        changed = [n for n in DEFINITION_FIELDS if _differs(getattr(locked, n), wanted[n])]
        if not changed:
            if spec.name != locked.name:
                old_name, locked.name = locked.name, spec.name
                locked.save(update_fields=["name", "updated_at"])
                _log(locked, ScheduleEvent.Kind.UPDATED, actor, now, name=[old_name, spec.name])
            return LifecycleResult(locked, Receipt("updated", now, locked.version))

        if {"kind", "expression"} & set(changed):
            _check_rule_interval(
                tenant=Tenant.objects.get(pk=locked.tenant_id),
                kind=spec.kind,
                expression=spec.expression,
            )
        new_version = locked.version + 1
        invalidated = _recall(
            schedule=locked, below=new_version, keep_lanes=[],
            from_states=[_SCHEDULED, _RETRY_WAIT], to_state=_SUPERSEDED, now=now,
        )  # fmt: skip
        kept = _latest_kept(schedule=locked, below=new_version, now=now)
        not_recalled = _not_recalled(schedule=locked, below=new_version, now=now)
        floor = max(now, kept) if kept is not None else now
        next_run_at = _next_for_new_version(spec=spec, floor=floor, kept=kept)
        if locked.state == Schedule.State.PAUSED:
            state = Schedule.State.PAUSED  # stays paused; resume applies the misfire policy
        else:
            state = Schedule.State.ACTIVE if next_run_at else Schedule.State.COMPLETED
        if locked.state == Schedule.State.COMPLETED and state == Schedule.State.ACTIVE:
            _lock_tenant_with_capacity(tenant=locked.tenant)  # reactivation needs capacity

        previous = locked.version
        locked.name = spec.name
        for name in DEFINITION_FIELDS:
            setattr(locked, name, wanted[name])
        locked.version, locked.state, locked.next_run_at = new_version, state, next_run_at
        locked.save(
            update_fields=["name", *DEFINITION_FIELDS, "version", "state", "next_run_at",
                           "updated_at"]
        )  # fmt: skip
        ScheduleVersion.objects.filter(schedule=locked, valid_to__isnull=True).update(valid_to=now)
        ScheduleVersion.objects.create(
            schedule=locked,
            tenant_id=locked.tenant_id,
            version=new_version,
            definition=_definition(locked),
            valid_from=now,
        )
        _log(
            locked, ScheduleEvent.Kind.UPDATED, actor, now,
            previous_version=previous, changed=changed, next_run_at=_iso(next_run_at),
            invalidated=len(invalidated), not_recalled=len(not_recalled),
        )  # fmt: skip
    receipt = Receipt(
        "updated", now, new_version, invalidated, _SUPERSEDED if invalidated else None,
        not_recalled,
    )  # fmt: skip
    return LifecycleResult(locked, receipt)


def schedule_pause(*, schedule: Schedule, actor: str) -> LifecycleResult:
    """Stop future materialization; cancel what is materialized but unpublished.

    `next_run_at` is kept: it is the first instant never materialized, so resume continues
    there and the misfire policy judges what was missed meanwhile. Retries of runs already in
    flight (RETRY_WAIT) continue and are listed as not recalled. Pausing a paused schedule
    changes nothing and logs nothing.
    """
    now = timezone.now()
    with transaction.atomic():
        locked = _lock(schedule)
        if locked.state == Schedule.State.PAUSED:
            return LifecycleResult(locked, Receipt("paused", now, locked.version))
        if locked.state != Schedule.State.ACTIVE:
            raise StateConflict(
                f"A {locked.state.lower()} schedule cannot be paused (only active ones)."
            )
        below = locked.version + 1
        invalidated = _recall(
            schedule=locked, below=below, keep_lanes=[_RETRY_LANE], from_states=[_SCHEDULED],
            to_state=_CANCELED, now=now,
        )  # fmt: skip
        not_recalled = _not_recalled(schedule=locked, below=below, now=now)
        locked.state = Schedule.State.PAUSED
        locked.save(update_fields=["state", "updated_at"])
        _log(
            locked, ScheduleEvent.Kind.PAUSED, actor, now,
            invalidated=len(invalidated), not_recalled=len(not_recalled),
            next_run_at=_iso(locked.next_run_at),
        )  # fmt: skip
    receipt = Receipt(
        "paused", now, locked.version, invalidated, _CANCELED if invalidated else None,
        not_recalled,
    )  # fmt: skip
    return LifecycleResult(locked, receipt)


def schedule_resume(*, schedule: Schedule, actor: str) -> LifecycleResult:
    """Make a paused schedule ACTIVE again from its persisted `next_run_at`.

    Instants that passed while paused are older than `now - max_lateness_s` when the
    materializer finds them, so its misfire policy decides (SKIP: MISSED; FIRE_ONCE: the
    latest fires; CATCHUP: up to `catchup_limit`), bounded as for any outage. Instants the
    pause canceled stay canceled (their ids were in the pause receipt).
    """
    now = timezone.now()
    with transaction.atomic():
        locked = _lock(schedule)
        if locked.state == Schedule.State.ACTIVE:
            return LifecycleResult(locked, Receipt("resumed", now, locked.version))
        if locked.state != Schedule.State.PAUSED:
            raise StateConflict(
                f"A {locked.state.lower()} schedule cannot be resumed (only paused ones)."
            )
        locked.state = (
            Schedule.State.ACTIVE if locked.next_run_at is not None else Schedule.State.COMPLETED
        )
        locked.save(update_fields=["state", "updated_at"])
        _log(
            locked, ScheduleEvent.Kind.RESUMED, actor, now,
            next_run_at=_iso(locked.next_run_at), misfire_policy=locked.misfire_policy,
        )  # fmt: skip
    return LifecycleResult(locked, Receipt("resumed", now, locked.version))


def schedule_cancel(*, schedule: Schedule, actor: str) -> LifecycleResult:
    """Cancel for good: state CANCELED, `next_run_at` NULL, pending unpublished occurrences
    (and pending retries) CANCELED with their outbox rows. Nothing is deleted; the versions
    and events stay for audit. Canceling again changes nothing and logs nothing (the receipt
    then lists only what is still in flight)."""
    now = timezone.now()
    with transaction.atomic():
        locked = _lock(schedule)
        below = locked.version + 1
        if locked.state == Schedule.State.CANCELED:
            not_recalled = _not_recalled(schedule=locked, below=below, now=now)
            return LifecycleResult(
                locked, Receipt("canceled", now, locked.version, not_recalled=not_recalled)
            )
        invalidated = _recall(
            schedule=locked, below=below, keep_lanes=[], from_states=[_SCHEDULED, _RETRY_WAIT],
            to_state=_CANCELED, now=now,
        )  # fmt: skip
        not_recalled = _not_recalled(schedule=locked, below=below, now=now)
        previous_state = locked.state
        locked.state, locked.next_run_at = Schedule.State.CANCELED, None
        locked.save(update_fields=["state", "next_run_at", "updated_at"])
        ScheduleVersion.objects.filter(schedule=locked, valid_to__isnull=True).update(valid_to=now)
        _log(
            locked, ScheduleEvent.Kind.CANCELED, actor, now, previous_state=previous_state,
            invalidated=len(invalidated), not_recalled=len(not_recalled),
        )  # fmt: skip
    receipt = Receipt(
        "canceled", now, locked.version, invalidated, _CANCELED if invalidated else None,
        not_recalled,
    )  # fmt: skip
    return LifecycleResult(locked, receipt)
