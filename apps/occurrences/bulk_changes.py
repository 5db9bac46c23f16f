"""Bulk changes: pause, resume, cancel or run now every schedule a selection matches (a
filter of the schedule list, or ids), with one receipt (docs/api.md "Bulk changes").

`bulk_start` counts the selection and writes a `BulkChange` row; `manage.py bulk` works the
row (`bulk_step`), a batch at a time, under a lease on the row, so a killed process's job is
taken up where it stopped once the lease runs out. Pause, resume and cancel work a batch in
runs: the schedules with nothing to recall set-based, one transaction per run
(bulk_batches.py); a schedule with outbox rows to recall through the single verb's service
(schedule_changes.py) in its own transaction, the only one that takes a relay shard barrier.
Run now is the single verb (manual_runs.py) per schedule. Each transaction also advances the
row's cursor and totals: the receipt adds up after any crash.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import takewhile
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Q, QuerySet
from django.utils import timezone

from apps.occurrences.bulk_batches import (
    ALREADY,
    CHANGES,
    RunOutcome,
    apply_run,
    recallable,
    relay_behind,
)
from apps.occurrences.manual_runs import schedule_run_now
from apps.occurrences.models import BulkChange
from apps.occurrences.schedule_changes import schedule_cancel, schedule_pause, schedule_resume
from apps.schedules.errors import QuotaExceeded
from apps.schedules.models import Schedule
from apps.schedules.selectors import schedules_filtered, schedules_for
from apps.schedules.services import QUOTA_STATES, lock_schedule
from apps.tenants.errors import RefusedRequest
from apps.tenants.models import Tenant

log = logging.getLogger("tick.bulk")

# Refusals kept with their reason in the receipt; the count covers all of them.
REFUSALS_KEPT = 1000
# How often a bulk waiting for the relay looks again.
YIELD_POLL_S = 0.1

Verb = BulkChange.Verb
State = Schedule.State

_SERVICES: dict[str, Callable[..., Any]] = {
    Verb.PAUSE: schedule_pause,
    Verb.RESUME: schedule_resume,
    Verb.CANCEL: schedule_cancel,
}


@dataclass(frozen=True)
class DryRun:
    """What a bulk change would do now, by the schedules' current states."""

    verb: str
    matched: int
    change: int
    already: int
    refuse: int


def selected(tenant: Tenant, selection: dict[str, Any]) -> QuerySet[Schedule]:
    """The tenant's schedules a stored selection names (`ids`, or the list's `filter`)."""
    if "ids" in selection:
        return schedules_for(tenant=tenant).filter(id__in=selection["ids"])
    wanted = dict(selection["filter"])
    if "label" in wanted:
        wanted["label"] = [tuple(pair) for pair in wanted["label"]]
    return schedules_filtered(tenant=tenant, **wanted)


def bulk_dry_run(*, tenant: Tenant, verb: str, selection: dict[str, Any]) -> DryRun:
    counts = {
        row["state"]: row["n"]
        for row in selected(tenant, selection).order_by().values("state").annotate(n=Count("id"))
    }
    matched = sum(counts.values())
    change = sum(counts.get(s, 0) for s in CHANGES[verb])
    already = sum(counts.get(s, 0) for s in ALREADY[verb])
    return DryRun(str(verb), matched, change, already, matched - change - already)


def _check_resume_quota(tenant: Tenant) -> None:
    """Paused schedules count against `max_active_schedules` (QUOTA_STATES), so resuming
    them takes no new capacity; only a tenant already over a quota lowered since is refused
    a bulk resume."""
    used = schedules_for(tenant=tenant).filter(state__in=QUOTA_STATES).count()
    if used > tenant.max_active_schedules:
        raise QuotaExceeded(
            f"This tenant has {used} active or paused schedules, over its quota of "
            f"{tenant.max_active_schedules}: resuming them would exceed it. Cancel some first."
        )


def bulk_start(*, tenant: Tenant, verb: str, selection: dict[str, Any], actor: str) -> BulkChange:
    """A RUNNING bulk change over what `selection` matches now; `manage.py bulk` works it."""
    if verb == Verb.RESUME:
        _check_resume_quota(tenant)
    matched = selected(tenant, selection).count()
    return BulkChange.objects.create(
        tenant=tenant, verb=verb, selection=selection, actor=actor, matched=matched
    )


def _claim(owner: str, now: datetime) -> BulkChange | None:
    """The oldest RUNNING job whose lease is free or ran out, leased to `owner`."""
    lease = timedelta(seconds=settings.TICK_BULK_LEASE_S)
    with transaction.atomic():
        job = (
            BulkChange.objects.select_for_update(skip_locked=True)
            .filter(state=BulkChange.State.RUNNING)
            .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now) | Q(lease_owner=owner))
            .order_by("created_at")
            .first()
        )
        if job is None:
            return None
        job.lease_owner, job.lease_until = owner, now + lease
        job.save(update_fields=["lease_owner", "lease_until"])
        return job


def _next_batch(job: BulkChange, size: int) -> list[Schedule]:
    queryset = selected(job.tenant, job.selection).order_by("-created_at", "-id")
    if job.after_created_at is not None and job.after_id is not None:
        queryset = queryset.filter(created_at__lte=job.after_created_at).exclude(
            created_at=job.after_created_at, id__gte=job.after_id
        )
    return list(queryset[:size])


def _count(
    job: BulkChange, schedule: Schedule, outcome: str, refusal: dict[str, str] | None
) -> None:
    """Advance the job past `schedule` with its outcome (in the caller's transaction)."""
    updates: dict[str, Any] = {
        "after_created_at": schedule.created_at, "after_id": schedule.id,
        outcome: F(outcome) + 1,
    }  # fmt: skip
    if refusal is not None and job.refused < REFUSALS_KEPT:
        job.refusals = [*job.refusals, refusal]
        updates["refusals"] = job.refusals
    BulkChange.objects.filter(pk=job.pk).update(**updates)
    setattr(job, outcome, getattr(job, outcome) + 1)
    job.after_created_at, job.after_id = schedule.created_at, schedule.id


def _refusal(schedule: Schedule, err: RefusedRequest) -> dict[str, str]:
    return {"id": str(schedule.id), "code": err.code, "message": err.message}


def _apply_state_verb(job: BulkChange, schedule: Schedule) -> None:
    """Pause, resume or cancel one schedule and count it, in one transaction."""
    with transaction.atomic():
        locked = lock_schedule(schedule)
        if locked.state in ALREADY[job.verb]:
            _count(job, locked, "already", None)
            return
        try:
            with transaction.atomic():
                _SERVICES[job.verb](schedule=locked, actor=job.actor)
        except RefusedRequest as err:
            _count(job, locked, "refused", _refusal(locked, err))
            return
        _count(job, locked, "changed", None)


def _deadline() -> float:
    """A third of the lease from now: a batch stops there (the cursor is exact after every
    transaction) and the next step renews the lease, so a slow batch (schedules to recall
    one by one) never outlives it and no second process works the job meanwhile."""
    return time.monotonic() + settings.TICK_BULK_LEASE_S / 3


def _count_run(job: BulkChange, counted: list[Schedule], outcome: RunOutcome) -> None:
    """Advance the job past `counted` with a set-based run's totals (in its transaction)."""
    last = counted[-1]
    updates: dict[str, Any] = {
        "after_created_at": last.created_at, "after_id": last.id,
        "changed": F("changed") + outcome.changed, "already": F("already") + outcome.already,
        "refused": F("refused") + len(outcome.refusals),
    }  # fmt: skip
    room = max(0, REFUSALS_KEPT - job.refused)
    if outcome.refusals and room:
        job.refusals = [*job.refusals, *outcome.refusals[:room]]
        updates["refusals"] = job.refusals
    BulkChange.objects.filter(pk=job.pk).update(**updates)
    job.changed += outcome.changed
    job.already += outcome.already
    job.refused += len(outcome.refusals)
    job.after_created_at, job.after_id = last.created_at, last.id


def _apply_state_verbs(job: BulkChange, schedules: list[Schedule]) -> None:
    """Pause, resume or cancel a batch: runs of schedules with nothing to recall set-based
    in one transaction each (bulk_batches.py); one with outbox rows to recall alone through
    the single verb, which takes its shard's relay barrier for that schedule only."""
    recall = recallable(job.verb, schedules)  # a hint; each run checks again under lock
    pending = schedules
    deadline = _deadline()
    while pending and (pending is schedules or time.monotonic() < deadline):
        started = time.monotonic()
        if pending[0].id in recall:
            _apply_state_verb(job, pending[0])
            pending = pending[1:]
        else:
            run = list(takewhile(lambda s: s.id not in recall, pending))
            with transaction.atomic():
                outcome = apply_run(verb=job.verb, run=run, actor=job.actor)
                if outcome.handled:
                    _count_run(job, run[: outcome.handled], outcome)
            if outcome.handled < len(run):
                recall.add(run[outcome.handled].id)
            pending = pending[outcome.handled :]
        _pace(time.monotonic() - started)


def _pace(worked_s: float) -> None:
    """Leave the machine to the pipeline between the bulk's transactions: rest in proportion
    to the work just done (`TICK_BULK_DUTY_PCT` of the time working), then, while the relay
    has due rows waiting, wait for it, at most `TICK_BULK_YIELD_MS` (a relay that stays
    behind, e.g. a broker outage, only slows the bulk). docs/decisions.md "Bulk changes: …"."""
    duty = settings.TICK_BULK_DUTY_PCT / 100
    if 0 < duty < 1:
        time.sleep(worked_s * (1 - duty) / duty)
    until = time.monotonic() + settings.TICK_BULK_YIELD_MS / 1000
    while time.monotonic() < until and relay_behind():
        time.sleep(YIELD_POLL_S)


def _apply_run_now(job: BulkChange, schedule: Schedule) -> None:
    """Run one schedule now under a request id of this job: after a crash the same id
    answers `replayed`, counted as the change it was."""
    outcome, refusal = "changed", None
    try:
        schedule_run_now(schedule=schedule, actor=job.actor, request_id=f"bulk:{job.id}")
    except RefusedRequest as err:
        outcome, refusal = "refused", _refusal(schedule, err)
    with transaction.atomic():
        _count(job, schedule, outcome, refusal)


def bulk_step(*, owner: str, batch: int | None = None, now: datetime | None = None) -> int:
    """Work one batch of the oldest job this process may hold; returns schedules counted
    (0 = nothing to do). The job is DONE once a batch finds no schedule left."""
    job = _claim(owner, now or timezone.now())
    if job is None:
        return 0
    schedules = _next_batch(job, batch or settings.TICK_BULK_BATCH)
    if job.verb == Verb.RUN_NOW:
        deadline = _deadline()
        for index, schedule in enumerate(schedules):
            if index and time.monotonic() >= deadline:
                break
            _apply_run_now(job, schedule)
    else:
        _apply_state_verbs(job, schedules)
    if not schedules:
        BulkChange.objects.filter(pk=job.pk).update(
            state=BulkChange.State.DONE, finished_at=timezone.now(), lease_until=None
        )
        log.info(
            "bulk %s %s done: %s changed, %s already, %s refused of %s",
            job.verb, job.id, job.changed, job.already, job.refused, job.matched,
        )  # fmt: skip
        return 1
    return len(schedules)


def bulk_work_all(*, owner: str) -> int:
    """Every RUNNING job to the end (tests and `manage.py bulk --once`)."""
    done = 0
    while (counted := bulk_step(owner=owner)) > 0:
        done += counted
    return done
