"""Schedule state transitions. Each writes its version row and audit event in the same
transaction as the change it records (no signals)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.schedules import timerules
from apps.schedules.models import Schedule, ScheduleEvent, ScheduleVersion, shard_for
from apps.tenants.models import Tenant

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


def first_run_at(
    *,
    kind: str,
    expression: str,
    run_at: datetime | None,
    time_zone: str,
    dst_gap: str,
    dst_fold: str,
    start_at: datetime | None,
    end_at: datetime | None,
    now: datetime,
) -> datetime | None:
    """The first instant to materialize for a new definition, or None if none remains."""
    if kind == Schedule.Kind.ONE_SHOT:
        return run_at
    return timerules.next_fire_time(
        expression,
        time_zone,
        now,
        dst_gap=dst_gap,
        dst_fold=dst_fold,
        start_at=start_at,
        end_at=end_at,
    )


def _definition(schedule: Schedule) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for name in DEFINITION_FIELDS:
        value = getattr(schedule, name)
        data[name] = value.isoformat() if isinstance(value, datetime) else value
    return data


@transaction.atomic
def schedule_create(*, tenant: Tenant, spec: ScheduleSpec, actor: str) -> Schedule:
    """Create an ACTIVE schedule, its version 1 and its `created` event.

    The spec must already be validated (serializer/form, which call timerules). The first
    `next_run_at` is computed here so the materializer finds the schedule in its due index.
    """
    now = timezone.now()
    schedule_id = uuid.uuid4()
    next_run_at = first_run_at(
        kind=spec.kind,
        expression=spec.expression,
        run_at=spec.run_at,
        time_zone=spec.time_zone,
        dst_gap=spec.dst_gap,
        dst_fold=spec.dst_fold,
        start_at=spec.start_at,
        end_at=spec.end_at,
        now=now,
    )
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
    *,
    kind: str,
    expression: str,
    run_at: datetime | None,
    time_zone: str,
    dst_gap: str,
    dst_fold: str,
    start_at: datetime | None,
    end_at: datetime | None,
    after: datetime,
    count: int,
) -> list[timerules.PreviewEntry]:
    """The next `count` fires after `after` (UTC and local, with DST notes)."""
    if kind == Schedule.Kind.ONE_SHOT:
        if run_at is None or run_at <= after:
            return []
        return [timerules.preview_one_shot(run_at, time_zone)]
    return timerules.preview(
        expression,
        time_zone,
        after,
        count,
        dst_gap=dst_gap,
        dst_fold=dst_fold,
        start_at=start_at,
        end_at=end_at,
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
    return schedule_preview(
        kind=schedule.kind,
        expression=schedule.expression,
        run_at=schedule.run_at,
        time_zone=schedule.time_zone,
        dst_gap=schedule.dst_gap,
        dst_fold=schedule.dst_fold,
        start_at=schedule.start_at,
        end_at=schedule.end_at,
        after=after,
        count=count,
    )
