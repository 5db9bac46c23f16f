"""Bulk pause, resume and cancel worked in set-based runs (apps/occurrences/bulk_batches.py)
leave every schedule as the single verb leaves its twin: state, version, columns, events and
their detail, occurrences, outbox rows, version intervals. The batches mix schedules to
change with nothing to recall, schedules with outbox rows to recall (the single verb's path),
schedules already so and refused ones, in batches smaller than the mix so runs split."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.occurrences import bulk_changes
from apps.occurrences.bulk_batches import relay_behind
from apps.occurrences.bulk_changes import bulk_start, bulk_step
from apps.occurrences.models import BulkChange, DispatchOutbox, Lane, Occurrence
from apps.occurrences.schedule_changes import schedule_cancel, schedule_pause, schedule_resume
from apps.occurrences.tests.support.rows import occurrence, schedule
from apps.schedules.models import Schedule, ScheduleEvent, ScheduleVersion
from apps.tenants.models import Tenant

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("partitions_around_today")]

ACTOR = "tester"
SINGLE: dict[str, Callable[..., Any]] = {
    "pause": schedule_pause, "resume": schedule_resume, "cancel": schedule_cancel,
}  # fmt: skip


def _pending(sched: Schedule, hours: int) -> Occurrence:
    """A SCHEDULED occurrence `hours` ahead with its (unpublished) outbox row."""
    occ = occurrence(sched, _base() + timedelta(hours=hours), state=Occurrence.State.SCHEDULED)
    DispatchOutbox.objects.create(
        occurrence_id=occ.id, scheduled_for=occ.scheduled_for, schedule_id=sched.id,
        schedule_version=sched.version, tenant_id=sched.tenant_id, shard=sched.shard,
        lane=Lane.STRICT, available_at=occ.scheduled_for, created_at=timezone.now(),
    )  # fmt: skip
    return occ


# Instants are whole hours from one point fixed at import: twins get equal instants, and the
# comparison does not move if an hour turns while a test runs.
BASE = timezone.now().replace(minute=0, second=0, microsecond=0)


def _base() -> Any:
    return BASE


def _set_state(sched: Schedule, state: Schedule.State, **fields: Any) -> None:
    Schedule.objects.filter(pk=sched.pk).update(state=state, **fields)


def _mix(tenant: Tenant, group: str) -> list[Schedule]:
    """One of each kind of schedule a bulk meets, in creation order (the bulk works newest
    first): quiet active ones, one with an in-flight run (counted not recalled), ones with
    outbox rows (recall), paused ones (one whose pause canceled an instant still ahead, one
    with no next run left), a completed one and a canceled one."""
    made: dict[str, Schedule] = {}
    names = ("quiet1", "inflight", "loaded1", "quiet2", "paused", "paused_restorable",
             "paused_done", "completed", "quiet3", "canceled", "loaded2", "quiet4")  # fmt: skip
    for name in names:
        made[name] = schedule(tenant, name=name, labels={"group": group})
    occurrence(made["inflight"], _base() - timedelta(hours=1), state=Occurrence.State.ENQUEUED)
    _pending(made["loaded1"], 30)
    _pending(made["loaded2"], 31)
    _pending(made["paused_restorable"], 32)
    schedule_pause(schedule=made["paused_restorable"], actor="earlier")
    _set_state(made["paused"], Schedule.State.PAUSED, dead_streak=3)
    _set_state(made["paused_done"], Schedule.State.PAUSED, next_run_at=None)
    _set_state(made["completed"], Schedule.State.COMPLETED, next_run_at=None)
    _set_state(made["canceled"], Schedule.State.CANCELED, next_run_at=None)
    return list(made.values())


def _outcome(sched: Schedule) -> dict[str, Any]:
    """Everything a lifecycle change writes, without ids and times that differ by twin."""
    row = Schedule.objects.get(pk=sched.pk)
    events = [
        (e.kind, e.version, e.actor, e.detail)
        for e in ScheduleEvent.objects.filter(schedule=sched).exclude(kind="created").order_by("id")
    ]
    base = _base()
    occurrences = sorted(
        (o.scheduled_for - base, o.state, o.finished_at is None)
        for o in Occurrence.objects.filter(schedule=sched)
    )
    outbox = sorted(
        r.scheduled_for - base for r in DispatchOutbox.objects.filter(schedule_id=sched.id)
    )
    open_versions = ScheduleVersion.objects.filter(schedule=sched, valid_to__isnull=True).count()
    return {
        "name": row.name, "state": row.state, "version": row.version,
        "next_run_at": row.next_run_at, "dead_streak": row.dead_streak, "events": events,
        "occurrences": occurrences, "outbox": outbox, "open_versions": open_versions,
    }  # fmt: skip


def _single(verb: str, schedules: list[Schedule]) -> tuple[int, int, int]:
    """The single verb on each, newest first as the bulk goes: (changed, already, refused)."""
    changed = already = refused = 0
    for sched in reversed(schedules):
        before = _outcome(sched)["events"]
        try:
            SINGLE[verb](schedule=sched, actor=ACTOR)
        except Exception:  # noqa: BLE001 - a refusal, whichever
            refused += 1
            continue
        if _outcome(sched)["events"] == before:
            already += 1
        else:
            changed += 1
    return changed, already, refused


def _bulk(tenant: Tenant, verb: str, group: str, batch: int) -> BulkChange:
    job = bulk_start(
        tenant=tenant, verb=verb, selection={"filter": {"label": [["group", group]]}}, actor=ACTOR
    )
    while bulk_step(owner="test", batch=batch):
        pass
    job.refresh_from_db()
    return job


@pytest.mark.parametrize("verb", ["pause", "resume", "cancel"])
@pytest.mark.parametrize("batch", [3, 1000])
def test_each_schedule_of_a_bulk_ends_as_the_single_verb_leaves_its_twin(tenant_a, verb, batch):
    bulk_side = _mix(tenant_a, "bulk")
    single_side = _mix(tenant_a, "single")

    job = _bulk(tenant_a, verb, "bulk", batch)
    counts = _single(verb, single_side)

    assert job.state == BulkChange.State.DONE
    assert (job.changed, job.already, job.refused) == counts
    assert job.changed + job.already + job.refused == job.matched == len(bulk_side)
    for mine, twin in zip(bulk_side, single_side, strict=True):
        assert _outcome(mine) == _outcome(twin), mine.name
    assert len(job.refusals) == job.refused
    for refusal in job.refusals:
        assert refusal["code"] == "state_conflict"


def test_the_recall_checked_under_lock_catches_rows_added_after_the_hint(
    tenant_a, monkeypatch: pytest.MonkeyPatch
):
    # The hint read before the lock saw no outbox rows (a materializer batch committed since):
    # the run must still hand the loaded schedules to the single verb, not pause them blind.
    monkeypatch.setattr(bulk_changes, "recallable", lambda verb, schedules: set())
    bulk_side = _mix(tenant_a, "bulk")
    single_side = _mix(tenant_a, "single")

    job = _bulk(tenant_a, "pause", "bulk", 1000)
    counts = _single("pause", single_side)

    assert (job.changed, job.already, job.refused) == counts
    for mine, twin in zip(bulk_side, single_side, strict=True):
        assert _outcome(mine) == _outcome(twin), mine.name
    assert not DispatchOutbox.objects.filter(schedule_id__in=[s.id for s in bulk_side]).exists()


def test_a_batch_of_quiet_schedules_costs_a_fixed_number_of_statements(tenant_a):
    for i in range(60):
        schedule(tenant_a, name=f"q{i}", labels={"group": "q"})
    job = bulk_start(
        tenant=tenant_a, verb="pause", selection={"filter": {"label": [["group", "q"]]}},
        actor=ACTOR,
    )  # fmt: skip

    with CaptureQueriesContext(connection) as queries:
        counted = bulk_step(owner="test", batch=1000)

    assert counted == 60
    # The claim, the batch read, the recall hint, one run (BEGIN, lock, probe, counts, update,
    # events, job row, COMMIT) and the relay probe: not 11 per schedule.
    assert len(queries) <= 20, [q["sql"][:80] for q in queries]
    job.refresh_from_db()
    assert job.changed == 60
    assert ScheduleEvent.objects.filter(kind=ScheduleEvent.Kind.PAUSED).count() == 60


def test_refusals_past_the_kept_number_are_counted_not_listed(tenant_a, monkeypatch):
    monkeypatch.setattr(bulk_changes, "REFUSALS_KEPT", 4)
    made = [schedule(tenant_a, name=f"c{i}", labels={"group": "c"}) for i in range(7)]
    Schedule.objects.filter(pk__in=[s.pk for s in made]).update(
        state=Schedule.State.COMPLETED, next_run_at=None
    )

    job = _bulk(tenant_a, "pause", "c", 3)

    assert (job.changed, job.already, job.refused) == (0, 0, 7)
    assert len(job.refusals) == 4


def _due_row(tenant: Tenant, seconds_ago: float) -> None:
    sched = schedule(tenant, name="other tenant's due run")
    occ = occurrence(sched, timezone.now() - timedelta(seconds=seconds_ago),
                     state=Occurrence.State.SCHEDULED)  # fmt: skip
    DispatchOutbox.objects.create(
        occurrence_id=occ.id, scheduled_for=occ.scheduled_for, schedule_id=sched.id,
        schedule_version=sched.version, tenant_id=sched.tenant_id, shard=sched.shard,
        lane=Lane.STRICT, available_at=occ.scheduled_for, created_at=timezone.now(),
    )  # fmt: skip


def test_the_relay_counts_as_behind_only_with_a_row_due_a_while_ago(tenant_b):
    assert not relay_behind()
    _due_row(tenant_b, seconds_ago=-60)  # due in a minute
    assert not relay_behind()
    _due_row(tenant_b, seconds_ago=30)
    assert relay_behind()


def test_a_bulk_waits_for_a_relay_behind_but_only_so_long(tenant_a, tenant_b, settings):
    settings.TICK_BULK_YIELD_MS = 300
    settings.TICK_BULK_DUTY_PCT = 100
    for i in range(6):
        schedule(tenant_a, name=f"w{i}", labels={"group": "w"})
    _due_row(tenant_b, seconds_ago=30)  # a relay that stays behind (broker down)

    started = time.monotonic()
    job = _bulk(tenant_a, "pause", "w", 2)
    took = time.monotonic() - started

    assert job.changed == 6
    # Three runs of two, each followed by the bounded wait (and none by more).
    assert 0.9 <= took < 5


def test_a_bulk_resume_at_a_full_quota_resumes_all_and_stays_within_it(tenant_a):
    # Paused schedules count against the quota: a resume takes no new capacity, so a full
    # quota refuses none, and after the bulk the tenant is still at (not over) it.
    made = [schedule(tenant_a, name=f"r{i}", labels={"group": "r"}) for i in range(5)]
    Schedule.objects.filter(pk__in=[s.pk for s in made]).update(state=Schedule.State.PAUSED)
    Tenant.objects.filter(pk=tenant_a.pk).update(max_active_schedules=5)

    job = _bulk(tenant_a, "resume", "r", 2)

    assert (job.changed, job.already, job.refused) == (5, 0, 0)
    in_quota = Schedule.objects.filter(
        tenant=tenant_a, state__in=[Schedule.State.ACTIVE, Schedule.State.PAUSED]
    )
    assert in_quota.count() == 5
