"""Schedule state transitions. Each writes its version row and audit event in the same
transaction as the change it records (no signals).

Changes of an existing schedule that recall occurrences (update, pause, resume, cancel) are
run by apps/occurrences/schedule_changes.py, which owns the outbox and occurrence rows: it
locks the schedule and writes it through the schedule-side functions at the end of this module.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeAlias

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.schedules import timerules
from apps.schedules.errors import LifecycleError, QuotaExceeded, RuleTooFrequent
from apps.schedules.models import Schedule, ScheduleEvent, ScheduleVersion, shard_for
from apps.tenants.models import Tenant

# Schedules that count against `Tenant.max_active_schedules`: a paused one can be resumed
# without asking for capacity again.
QUOTA_STATES = (Schedule.State.ACTIVE, Schedule.State.PAUSED)
# Rule-frequency check: 1441 consecutive fires always span every minute-of-day position of a
# cron rule once (a day has 1440 minutes), so their smallest gap is the rule's smallest gap.
_INTERVAL_SAMPLE = 1441

# Fields whose change alters future runs; they are what a ScheduleVersion records.
DEFINITION_FIELDS = (
    "kind",
    "expression",
    "run_at",
    "interval_s",
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
    "timeout_s",
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
    # A fixed rate's period; its anchor is start_at (the serializer defaults it to "now").
    interval_s: int | None = None
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
    # Run-time limit of one attempt; None = the handler's default. At most the tenant's
    # `max_timeout_s` (checked here, under the tenant lock, like the rule frequency).
    timeout_s: int | None = None
    # `key: value` labels, validated (apps/schedules/labels.py); None keeps the saved ones.
    labels: dict[str, str] | None = None
    # Pause after this many consecutive DEAD occurrences (0 = never); None = the tenant's
    # default on create, the saved value on update.
    pause_after_dead: int | None = None


# The fields that decide *when* a schedule fires, read alike from a saved schedule and from a
# definition not saved yet (a draft preview, a create or an update).
Timing: TypeAlias = Schedule | ScheduleSpec


def first_run_at(*, timing: Timing, now: datetime) -> datetime | None:
    """The first instant to materialize for a new definition, or None if none remains."""
    if timing.kind == Schedule.Kind.ONE_SHOT:
        return timing.run_at
    if timing.kind == Schedule.Kind.INTERVAL:
        found = timerules.interval_fire_times(
            _period(timing), _anchor(timing), now, 1, end_at=timing.end_at
        )
        return found[0] if found else None
    return timerules.next_fire_time(
        timing.expression,
        timing.time_zone,
        now,
        dst_gap=timing.dst_gap,
        dst_fold=timing.dst_fold,
        start_at=timing.start_at,
        end_at=timing.end_at,
    )


def _period(timing: Timing) -> int:
    assert timing.interval_s is not None, "a fixed-rate definition has its period"
    return timing.interval_s


def _anchor(timing: Timing) -> datetime:
    assert timing.start_at is not None, "a fixed-rate definition has its anchor (start_at)"
    return timing.start_at


class RepeatingRule(Protocol):
    """The fields that decide a cron or fixed-rate schedule's instants, as a saved schedule
    and the rows the pipeline reads carry them."""

    kind: str
    expression: str
    time_zone: str
    dst_gap: str
    dst_fold: str
    interval_s: int | None
    start_at: datetime | None


def rule_times_between(
    rule: RepeatingRule, after: datetime, until: datetime, *, limit: int
) -> list[datetime]:
    """A cron or fixed-rate rule's instants in ``(after, until]`` (aware UTC, ascending), at
    most ``limit``. A one-shot's single instant and the schedule's own start_at/end_at are
    the caller's (each applies them its own way)."""
    if rule.kind == Schedule.Kind.INTERVAL:
        # The constraint schedule_interval_defined: a fixed rate has its period and anchor.
        assert rule.interval_s is not None and rule.start_at is not None
        return timerules.interval_fire_times_between(
            rule.interval_s, rule.start_at, after, until, limit=limit
        )
    return timerules.fire_times_between(
        rule.expression, rule.time_zone, after, until,
        dst_gap=rule.dst_gap, dst_fold=rule.dst_fold, limit=limit,
    )  # fmt: skip


def rule_times_from(schedule: Schedule, first: datetime, count: int) -> list[datetime]:
    """A saved schedule's instants from `first` on (itself an instant of the rule: the
    materializer's cursor; a one-shot's only one), at most `count`; the later ones before its
    end_at (the caller bounds `first`)."""
    if count <= 0:
        return []
    if schedule.kind == Schedule.Kind.ONE_SHOT:
        return [first]
    if schedule.kind == Schedule.Kind.INTERVAL:
        # The constraint schedule_interval_defined: a fixed rate has its period and anchor.
        assert schedule.interval_s is not None and schedule.start_at is not None
        later = timerules.interval_fire_times(
            schedule.interval_s, schedule.start_at, first, count - 1, end_at=schedule.end_at
        )
    else:
        later = timerules.next_fire_times(
            schedule.expression, schedule.time_zone, first, count - 1,
            dst_gap=schedule.dst_gap, dst_fold=schedule.dst_fold, end_at=schedule.end_at,
        )  # fmt: skip
    return [first, *later]


def _definition(schedule: Schedule) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for name in DEFINITION_FIELDS:
        value = getattr(schedule, name)
        data[name] = value.isoformat() if isinstance(value, datetime) else value
    return data


def _open_version(schedule: Schedule, now: datetime) -> None:
    ScheduleVersion.objects.create(
        schedule=schedule,
        tenant_id=schedule.tenant_id,
        version=schedule.version,
        definition=_definition(schedule),
        valid_from=now,
    )


def log_event(
    schedule: Schedule, kind: ScheduleEvent.Kind, actor: str, now: datetime, **detail: Any
) -> ScheduleEvent:
    """Record `kind` in the schedule's audit trail, at its current version."""
    return ScheduleEvent.objects.create(
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


def rule_min_gap_s(*, expression: str) -> int | None:
    """Smallest gap in seconds between consecutive fires of a cron rule on the wall clock, or
    None if it fires at most once. Evaluated in UTC: DST transitions can shorten one gap by
    the DST delta twice a year, which the quota deliberately ignores."""
    fires = timerules.next_fire_times(
        expression, "UTC", datetime(2000, 1, 1, tzinfo=UTC), _INTERVAL_SAMPLE
    )
    gaps = [(b - a).total_seconds() for a, b in zip(fires, fires[1:], strict=False)]
    return int(min(gaps)) if gaps else None


def _check_rule_interval(
    *, tenant: Tenant, kind: str, expression: str, interval_s: int | None = None
) -> None:
    if kind == Schedule.Kind.INTERVAL and interval_s is not None:
        if interval_s < tenant.min_interval_s:
            raise RuleTooFrequent(
                f"interval_s is {interval_s} s; this tenant allows at least "
                f"{tenant.min_interval_s} s between fires.",
                field="interval_s",
            )
        return
    if kind != Schedule.Kind.CRON:
        return
    gap = rule_min_gap_s(expression=expression)
    if gap is not None and gap < tenant.min_interval_s:
        raise RuleTooFrequent(
            f"The rule fires {gap} s apart at its closest; this tenant allows at least "
            f"{tenant.min_interval_s} s between fires.",
            field="expression",
        )


def _check_timeout(*, tenant: Tenant, timeout_s: int | None) -> None:
    if timeout_s is not None and timeout_s > tenant.max_timeout_s:
        raise LifecycleError(
            f"timeout_s is {timeout_s} s; this tenant allows at most {tenant.max_timeout_s} s "
            "per attempt. Leave it out for the handler's default.",
            field="timeout_s",
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
    _check_rule_interval(
        tenant=tenant, kind=spec.kind, expression=spec.expression, interval_s=spec.interval_s
    )
    _check_timeout(tenant=tenant, timeout_s=spec.timeout_s)
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
        interval_s=spec.interval_s,
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
        timeout_s=spec.timeout_s,
        labels=spec.labels or {},
        pause_after_dead=(
            spec.pause_after_dead if spec.pause_after_dead is not None else tenant.pause_after_dead
        ),
        version=1,
        state=Schedule.State.ACTIVE if next_run_at is not None else Schedule.State.COMPLETED,
        next_run_at=next_run_at,
        shard=shard_for(schedule_id, settings.TICK_SHARDS),
    )
    _open_version(schedule, now)
    log_event(schedule, ScheduleEvent.Kind.CREATED, actor, now, next_run_at=_iso(next_run_at))
    return schedule


def schedule_preview(
    *, timing: Timing, after: datetime, count: int
) -> list[timerules.PreviewEntry]:
    """The next `count` fires after `after` (UTC and local, with DST notes)."""
    if timing.kind == Schedule.Kind.ONE_SHOT:
        if timing.run_at is None or timing.run_at <= after:
            return []
        return [timerules.preview_one_shot(timing.run_at, timing.time_zone)]
    if timing.kind == Schedule.Kind.INTERVAL:
        times = timerules.interval_fire_times(
            _period(timing), _anchor(timing), after, count, end_at=timing.end_at
        )
        return timerules.interval_preview(times, _period(timing), timing.time_zone)
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


# Extra instants the rule's preview is asked for beyond the ones worded
# (`schedule_preview_instants`): room for instants that ran out of turn between them.
PREVIEW_SLACK = 10


def schedule_preview_instants(
    *, schedule: Schedule, instants: Sequence[datetime]
) -> list[timerules.PreviewEntry]:
    """Preview entries (UTC and local, with DST notes) of chosen instants of a saved
    schedule's rule, ascending: its next fires as its page lists them (docs/ui.md). Worded
    by the rule's preview from the first; an instant the preview does not reach (instants
    that already ran between them took its places) gets no notes."""
    if not instants:
        return []
    entries = schedule_preview(
        timing=schedule,
        after=instants[0] - timedelta(microseconds=1),
        count=len(instants) + PREVIEW_SLACK,
    )
    by_instant = {entry.at_utc: entry for entry in entries}
    return [
        by_instant.get(at) or timerules.preview_one_shot(at, schedule.time_zone) for at in instants
    ]


# DST changes are looked for this far ahead, whatever the preview's count (docs/ui.md).
DST_LOOKAHEAD_DAYS = 366


def schedule_dst_changes(*, timing: Timing, now: datetime) -> list[timerules.DstChange]:
    """The DST changes of the coming year that a cron rule meets in its zone, worded per its
    DST gap / fold options; none for a one-shot (its instant is resolved when it is saved)
    or a schedule that will not fire again."""
    if timing.kind != Schedule.Kind.CRON:
        return []
    if isinstance(timing, Schedule) and timing.state in (
        Schedule.State.CANCELED,
        Schedule.State.COMPLETED,
    ):
        return []
    return timerules.dst_changes(
        timing.expression,
        timing.time_zone,
        now,
        days=DST_LOOKAHEAD_DAYS,
        dst_gap=timing.dst_gap,
        dst_fold=timing.dst_fold,
        start_at=timing.start_at,
        end_at=timing.end_at,
    )


# --------------------------------------------------------------------------------------------
# Schedule-side writes of update, pause, resume and cancel. Those changes, with their
# occurrence recall and lock order, are run by apps/occurrences/schedule_changes.py; these
# functions run inside its transaction, on the row it locked with `lock_schedule`.
# --------------------------------------------------------------------------------------------


def lock_schedule(schedule: Schedule) -> Schedule:
    """The schedule's row, read again and locked FOR UPDATE until the transaction ends."""
    return Schedule.objects.select_for_update().get(pk=schedule.pk, tenant_id=schedule.tenant_id)


def _differs(current: Any, wanted: Any) -> bool:
    return bool(current != wanted)


def _wanted_definition(spec: ScheduleSpec) -> dict[str, Any]:
    wanted = {name: getattr(spec, name) for name in DEFINITION_FIELDS}
    wanted["payload"] = spec.payload if spec.payload is not None else {}
    return wanted


def changed_definition_fields(*, schedule: Schedule, spec: ScheduleSpec) -> list[str]:
    """The DEFINITION_FIELDS in which `spec` differs from `schedule`: any makes a new version."""
    wanted = _wanted_definition(spec)
    return [name for name in DEFINITION_FIELDS if _differs(getattr(schedule, name), wanted[name])]


def schedule_rename(
    *,
    schedule: Schedule,
    name: str,
    actor: str,
    now: datetime,
    labels: dict[str, str] | None = None,
    pause_after_dead: int | None = None,
) -> None:
    """Rename, relabel or change the pause-after-DEAD setting without a new version (no run
    depends on them); the same values change nothing and log nothing."""
    detail: dict[str, Any] = {}
    if name != schedule.name:
        detail["name"], schedule.name = [schedule.name, name], name
    if labels is not None and labels != schedule.labels:
        detail["labels"], schedule.labels = [schedule.labels, labels], labels
    if pause_after_dead is not None and pause_after_dead != schedule.pause_after_dead:
        detail["pause_after_dead"] = [schedule.pause_after_dead, pause_after_dead]
        schedule.pause_after_dead = pause_after_dead
    if not detail:
        return
    schedule.save(update_fields=["name", "labels", "pause_after_dead", "updated_at"])
    log_event(schedule, ScheduleEvent.Kind.UPDATED, actor, now, **detail)


def check_tenant_limits(*, schedule: Schedule, spec: ScheduleSpec, changed: list[str]) -> None:
    """Refuse a changed rule that fires closer together than the tenant allows, or a changed
    run-time limit above the tenant's maximum (an unchanged one stays, even if the maximum
    was lowered since: the worker caps it)."""
    checks_rule = bool({"kind", "expression", "interval_s"} & set(changed))
    if not checks_rule and "timeout_s" not in changed:
        return
    tenant = Tenant.objects.get(pk=schedule.tenant_id)
    if checks_rule:
        _check_rule_interval(
            tenant=tenant, kind=spec.kind, expression=spec.expression, interval_s=spec.interval_s
        )
    if "timeout_s" in changed:
        _check_timeout(tenant=tenant, timeout_s=spec.timeout_s)


def next_run_for_new_version(
    *, spec: ScheduleSpec, now: datetime, kept: datetime | None
) -> datetime | None:
    """First instant of the new definition after max(now, `kept`), `kept` being the latest
    future instant an older version already produced and kept: no instant fires twice across
    versions. A one-shot keeps its run_at, even a slightly late one, unless an older version
    already produced that instant or a later one."""
    if spec.kind == Schedule.Kind.ONE_SHOT:
        if spec.run_at is None or (kept is not None and spec.run_at <= kept):
            return None
        return spec.run_at
    return first_run_at(timing=spec, now=max(now, kept) if kept is not None else now)


def _state_for_new_version(schedule: Schedule, next_run_at: datetime | None) -> str:
    if schedule.state == Schedule.State.PAUSED:
        return Schedule.State.PAUSED  # stays paused; resume applies the misfire policy
    state = Schedule.State.ACTIVE if next_run_at else Schedule.State.COMPLETED
    if schedule.state == Schedule.State.COMPLETED and state == Schedule.State.ACTIVE:
        _lock_tenant_with_capacity(tenant=schedule.tenant)  # reactivation needs capacity
    return state


def _close_current_version(schedule: Schedule, now: datetime) -> None:
    ScheduleVersion.objects.filter(schedule=schedule, valid_to__isnull=True).update(valid_to=now)


def apply_new_version(
    *,
    schedule: Schedule,
    spec: ScheduleSpec,
    changed: list[str],
    next_run_at: datetime | None,
    actor: str,
    now: datetime,
    invalidated: int,
    not_recalled: int,
    missed: int = 0,
) -> None:
    """Write `spec` as the schedule's next version: its state (ACTIVE, COMPLETED, or still
    PAUSED), the previous version's interval closed at `now` (the boundary), the new one
    opened there, `updated` logged with what the recall did (`invalidated`, `not_recalled`
    counts) and `missed`, the old version's instants before the boundary recorded MISSED."""
    state = _state_for_new_version(schedule, next_run_at)
    previous = schedule.version
    schedule.name = spec.name
    if spec.labels is not None and spec.labels != schedule.labels:
        schedule.labels = spec.labels
        changed = [*changed, "labels"]
    if spec.pause_after_dead is not None and spec.pause_after_dead != schedule.pause_after_dead:
        schedule.pause_after_dead = spec.pause_after_dead
        changed = [*changed, "pause_after_dead"]
    for name, value in _wanted_definition(spec).items():
        setattr(schedule, name, value)
    schedule.version, schedule.state, schedule.next_run_at = previous + 1, state, next_run_at
    schedule.save(
        update_fields=["name", "labels", "pause_after_dead", *DEFINITION_FIELDS, "version",
                       "state", "next_run_at", "updated_at"]
    )  # fmt: skip
    _close_current_version(schedule, now)
    _open_version(schedule, now)
    log_event(
        schedule, ScheduleEvent.Kind.UPDATED, actor, now,
        previous_version=previous, changed=changed, next_run_at=_iso(next_run_at),
        invalidated=invalidated, not_recalled=not_recalled, missed=missed,
    )  # fmt: skip


def mark_paused(
    *,
    schedule: Schedule,
    actor: str,
    now: datetime,
    invalidated: int,
    not_recalled: int,
    reason: str = "",
) -> ScheduleEvent:
    """PAUSED, `next_run_at` kept (resume continues there); `paused` logged with the recall
    counts and, when Tick paused it by itself, why."""
    schedule.state = Schedule.State.PAUSED
    schedule.save(update_fields=["state", "updated_at"])
    extra = {"reason": reason} if reason else {}
    return log_event(
        schedule, ScheduleEvent.Kind.PAUSED, actor, now,
        invalidated=invalidated, not_recalled=not_recalled, next_run_at=_iso(schedule.next_run_at),
        **extra,
    )  # fmt: skip


def mark_active(*, schedule: Schedule, actor: str, now: datetime, restored: int = 0) -> None:
    """ACTIVE again from the persisted `next_run_at` (COMPLETED if none remains: occurrences
    already materialized still run, as after any last batch); `resumed` logged with the
    count of occurrences the pause had canceled and resume `restored`."""
    schedule.state = (
        Schedule.State.ACTIVE if schedule.next_run_at is not None else Schedule.State.COMPLETED
    )
    # A resume starts the count of consecutive DEAD occurrences again.
    schedule.dead_streak = 0
    schedule.save(update_fields=["state", "dead_streak", "updated_at"])
    log_event(
        schedule, ScheduleEvent.Kind.RESUMED, actor, now,
        next_run_at=_iso(schedule.next_run_at), misfire_policy=schedule.misfire_policy,
        restored=restored,
    )  # fmt: skip


def mark_canceled(
    *, schedule: Schedule, actor: str, now: datetime, invalidated: int, not_recalled: int
) -> None:
    """CANCELED for good: `next_run_at` NULL, the current version's interval closed,
    `canceled` logged with the previous state and the recall counts."""
    previous_state = schedule.state
    schedule.state, schedule.next_run_at = Schedule.State.CANCELED, None
    schedule.save(update_fields=["state", "next_run_at", "updated_at"])
    _close_current_version(schedule, now)
    log_event(
        schedule, ScheduleEvent.Kind.CANCELED, actor, now, previous_state=previous_state,
        invalidated=invalidated, not_recalled=not_recalled,
    )  # fmt: skip
