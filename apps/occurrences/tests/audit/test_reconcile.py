"""The reconciliation audit: clean data passes, and every planted fault is found."""

from __future__ import annotations

import io
import json
import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine
from django.conf import settings
from django.core.management import call_command
from django.db import connection

from apps.occurrences.audit.reconcile import (
    FAILING,
    ReconcileReport,
    StuckBounds,
    expected_cron_instants,
    reconcile,
)
from apps.occurrences.models import Attempt, DispatchOutbox, Lane, Occurrence, occurrence_id_for
from apps.occurrences.pipeline.materializer import materialize_pass
from apps.occurrences.schedule_changes import schedule_pause, schedule_update
from apps.occurrences.tests.support.pipeline import leases, materialize_config
from apps.schedules import timerules
from apps.schedules.models import Schedule
from apps.schedules.services import ScheduleSpec
from apps.schedules.tests.factories import make_schedule
from apps.tenants.models import Tenant

pytestmark = pytest.mark.django_db

# Europe/Berlin springs forward at 01:00 UTC on 2026-03-29 (02:00 local does not exist).
T0 = datetime(2026, 3, 29, 0, 0, tzinfo=UTC)
START, END = T0 - timedelta(hours=2), T0 + timedelta(hours=4)
# The world's last change (the pause) happens at T0 + 40 min; the stuck classes are judged then.
NOW = T0 + timedelta(minutes=40)


def _audit(**kwargs: Any) -> ReconcileReport:
    return reconcile(start=START, end=END, chunk_size=7, now=NOW, **kwargs)


def _failing(report: ReconcileReport) -> set[tuple[str, str, str]]:
    return {
        (kind, f.schedule_id, f.scheduled_for)
        for kind in FAILING
        for f in report.samples.get(kind, [])
    }


def _failing_counts(report: ReconcileReport) -> dict[str, int]:
    return {kind: report.counts[kind] for kind in FAILING if report.counts[kind]}


def _world(tenant: Tenant) -> dict[str, Schedule]:
    """Schedules created at T0 - 2 h, materializer down until T0 (misfire: FIRE_ONCE / SKIP,
    ten recorded MISSED rows and a summary), an update and a pause, the first hour done."""
    made: dict[str, Schedule] = {}
    with time_machine.travel(START, tick=False):
        for i in range(20):
            made[f"utc{i}"] = make_schedule(tenant, name=f"utc{i}", expression="*/5 * * * *")
        made["skip"] = make_schedule(
            tenant, name="skip", expression="*/5 * * * *", misfire_policy="SKIP"
        )
        made["berlin"] = make_schedule(
            tenant, name="berlin", expression="15 */2 * * *", time_zone="Europe/Berlin"
        )
        made["berlin_shift"] = make_schedule(
            tenant, name="berlin_shift", expression="30 2 * * *", time_zone="Europe/Berlin",
            dst_gap="shift", max_lateness_s=3600 * 3,
        )  # fmt: skip
        made["berlin20"] = make_schedule(
            tenant, name="berlin20", expression="*/20 * * * *", time_zone="Europe/Berlin"
        )
        made["updated"] = make_schedule(tenant, name="updated", expression="*/10 * * * *")
        made["paused"] = make_schedule(tenant, name="paused", expression="*/10 * * * *")
        made["once"] = make_schedule(
            tenant, name="once", kind="ONE_SHOT", expression="",
            run_at=T0 + timedelta(minutes=90),
        )  # fmt: skip
    config = materialize_config(window_s=3 * 3600)
    with time_machine.travel(T0, tick=False):
        materialize_pass(leases=leases(), now=T0, config=config)
    at = T0 + timedelta(minutes=30)
    with time_machine.travel(at, tick=False):
        schedule_update(
            schedule=Schedule.objects.get(pk=made["updated"].pk),
            spec=ScheduleSpec(
                name="updated",
                kind="CRON",
                expression="*/15 * * * *",
                time_zone="UTC",
                handler="record",
            ),  # fmt: skip
            actor="test",
        )
        materialize_pass(leases=leases(), now=at, config=config)
    with time_machine.travel(at + timedelta(minutes=10), tick=False):
        schedule_pause(schedule=Schedule.objects.get(pk=made["paused"].pk), actor="test")
    # The first hour ran: succeeded, outbox rows gone.
    done = Occurrence.objects.filter(
        state__in=["SCHEDULED"], scheduled_for__lt=T0 + timedelta(hours=1)
    )
    ids = list(done.values_list("id", flat=True))
    done.update(state="SUCCEEDED", enqueued_at=T0, finished_at=T0)
    DispatchOutbox.objects.filter(occurrence_id__in=ids).delete()
    return made


def test_independent_matcher_agrees_with_timerules_across_dst() -> None:
    cases = [
        ("15 */2 * * *", "Europe/Berlin", "skip", "first"),
        ("30 2 * * *", "Europe/Berlin", "shift", "first"),
        ("*/20 1-3 * * *", "Europe/Berlin", "shift", "both"),
        ("30 1 * * *", "America/New_York", "skip", "both"),
        ("0 9 * * mon-fri", "Asia/Tokyo", "skip", "first"),
        ("0 0 1,15 * 5", "Australia/Lord_Howe", "shift", "both"),
    ]
    lo, hi = datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 11, 15, tzinfo=UTC)
    for expression, zone, gap, fold in cases:
        mine = expected_cron_instants(expression, zone, gap, fold, lo, hi)
        theirs = timerules.fire_times_between(
            expression, zone, lo - timedelta(microseconds=1), hi - timedelta(microseconds=1),
            dst_gap=gap, dst_fold=fold, limit=100_000,
        )  # fmt: skip
        assert list(mine) == list(theirs), (expression, zone, gap, fold)


def test_clean_data_has_nothing_missing_or_unexpected(tenant_a: Tenant) -> None:
    _world(tenant_a)

    report = _audit()

    assert report.counts["missing"] == 0, report.as_json()
    assert report.counts["unexpected"] == 0, report.as_json()
    assert report.counts["stranded"] == 0, report.as_json()
    assert _failing_counts(report) == {}, report.as_json()
    assert not report.failed
    counts = report.counts
    for kind in ("succeeded", "pending", "missed", "missed_summarised", "superseded",
                 "canceled", "beyond_frontier"):  # fmt: skip
        assert counts[kind] > 0, (kind, report.as_json())
    assert report.schedules == 27
    assert report.stored == Occurrence.objects.count()


def test_every_planted_fault_is_found_and_nothing_else(tenant_a: Tenant) -> None:
    made = _world(tenant_a)
    assert not _audit().failed
    planted: set[tuple[str, str, str]] = set()
    rng = random.Random(8)

    # 1. delete 1 % of the occurrences (of ordinary runs: succeeded or pending, on time - a
    # deleted late run would also leave its MISSED predecessors short, late_runs_too_few)
    candidates = list(
        Occurrence.objects.filter(
            schedule__name__startswith="utc", state__in=["SUCCEEDED", "SCHEDULED"],
            lane=Lane.STRICT,
        ).values_list("id", "schedule_id", "scheduled_for")
    )  # fmt: skip
    total = Occurrence.objects.count()
    victims = rng.sample(candidates, max(1, total // 100))
    for occ_id, sid, at in victims:
        Occurrence.objects.filter(id=occ_id, scheduled_for=at).delete()
        DispatchOutbox.objects.filter(occurrence_id=occ_id).delete()
        planted.add(("missing", str(sid), at.isoformat()))
    victim_ids = {v[0] for v in victims}

    # 2. delete the outbox rows of committed-but-unpublished occurrences
    unpublished = [
        row
        for row in Occurrence.objects.filter(
            schedule__name__startswith="utc", state="SCHEDULED"
        ).values_list("id", "schedule_id", "scheduled_for")
        if row[0] not in victim_ids
    ][:3]
    for occ_id, sid, at in unpublished:
        DispatchOutbox.objects.filter(occurrence_id=occ_id).delete()
        planted.add(("stranded", str(sid), at.isoformat()))

    # 3. a phantom occurrence off the rule (with a well-formed id)
    phantom = made["utc19"]
    phantom_at = T0 + timedelta(hours=2, minutes=7)
    Occurrence.objects.create(
        id=occurrence_id_for(phantom.id, 1, phantom_at), scheduled_for=phantom_at,
        schedule=phantom, schedule_version=1, tenant=tenant_a, lane="strict",
        state="SUCCEEDED", available_at=phantom_at, created_at=T0,
    )  # fmt: skip
    planted.add(("unexpected", str(phantom.id), phantom_at.isoformat()))

    # 4. shift one DST-zone occurrence by an hour (04:15 CEST -> 05:15 CEST)
    berlin = made["berlin"]
    original = datetime(2026, 3, 29, 2, 15, tzinfo=UTC)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE occurrences_occurrence SET scheduled_for = scheduled_for + interval '1 hour'"
            " WHERE schedule_id = %s AND scheduled_for = %s",
            [berlin.id, original],
        )
        assert cursor.rowcount == 1
    planted.add(("missing", str(berlin.id), original.isoformat()))
    planted.add(("unexpected", str(berlin.id), (original + timedelta(hours=1)).isoformat()))

    # 5. advance one next_run_at by a period
    advanced = Schedule.objects.get(pk=made["utc0"].pk)
    assert advanced.next_run_at is not None
    skipped = advanced.next_run_at
    Schedule.objects.filter(pk=advanced.pk).update(next_run_at=skipped + timedelta(minutes=5))
    planted.add(("missing", str(advanced.id), skipped.isoformat()))

    report = _audit()

    assert _failing(report) == planted
    assert report.counts["missing"] + report.counts["unexpected"] + report.counts[
        "stranded"
    ] == len(planted)


def test_command_exits_non_zero_and_prints_json_on_a_gap(tenant_a: Tenant, capsys: Any) -> None:
    made = _world(tenant_a)
    args = ["--from", START.isoformat(), "--to", END.isoformat(), "--json"]
    with time_machine.travel(NOW, tick=False):
        call_command("reconcile", *args, "--tenant", tenant_a.slug)
    assert '"ok": true' in capsys.readouterr().out
    victim = Occurrence.objects.filter(schedule=made["utc3"], state="SUCCEEDED").first()
    assert victim is not None
    Occurrence.objects.filter(id=victim.id, scheduled_for=victim.scheduled_for).delete()

    with time_machine.travel(NOW, tick=False), pytest.raises(SystemExit) as exited:
        call_command("reconcile", *args)

    assert exited.value.code == 1
    out = capsys.readouterr().out
    assert '"missing": 1' in out
    assert victim.scheduled_for.isoformat() in out


def test_recomputed_ids_equal_the_contracts_uuid5() -> None:
    from apps.occurrences.audit.reconcile import expected_id_bytes

    sid = uuid.uuid4()
    for at in (T0, T0 + timedelta(microseconds=7), END):
        assert expected_id_bytes(str(sid), 3, at) == occurrence_id_for(sid, 3, at).bytes


def test_textfile_export_for_the_missing_occurrences_alert(tenant_a: Tenant, tmp_path: Any) -> None:
    _world(tenant_a)
    path = tmp_path / "tick_reconcile.prom"

    with time_machine.travel(NOW, tick=False):
        call_command(
            "reconcile", "--from", START.isoformat(), "--to", END.isoformat(), "--textfile",
            str(path), stdout=io.StringIO(),
        )  # fmt: skip

    text = path.read_text()
    for kind in FAILING:
        assert f'tick_reconcile_findings{{kind="{kind}"}} 0' in text, kind
    assert "tick_reconcile_last_run_timestamp_seconds" in text


# --------------------------------------------------------------------------------------------
# Stuck work: judged at NOW, bounds from the settings (900 s enqueued, 300 s otherwise)
# --------------------------------------------------------------------------------------------


def _occurrence(schedule: Schedule, minutes: int) -> Occurrence:
    """The row of `schedule` at T0 + `minutes` (first hour: SUCCEEDED by `_world`)."""
    return Occurrence.objects.get(schedule=schedule, scheduled_for=T0 + timedelta(minutes=minutes))


def _set(occ: Occurrence, **fields: Any) -> None:
    Occurrence.objects.filter(id=occ.id, scheduled_for=occ.scheduled_for).update(**fields)


def _enqueued(schedule: Schedule, minutes: int, **fields: Any) -> Occurrence:
    """The row of `schedule` at T0 + `minutes`, back to ENQUEUED since its instant (the first
    publish) with no attempt yet; `fields` are set too."""
    occ = _occurrence(schedule, minutes)
    _set(
        occ,
        state=Occurrence.State.ENQUEUED,
        enqueued_at=occ.scheduled_for,
        finished_at=None,
        **fields,
    )
    return occ


def _outbox(occ: Occurrence, available_at: datetime) -> None:
    DispatchOutbox.objects.create(
        occurrence_id=occ.id, scheduled_for=occ.scheduled_for, schedule_id=occ.schedule_id,
        schedule_version=occ.schedule_version, tenant_id=occ.tenant_id,
        shard=occ.schedule.shard, lane=Lane.RETRY, available_at=available_at, created_at=NOW,
    )  # fmt: skip


def _attempt(occ: Occurrence, *, lease_expires_at: datetime, finished_at: datetime | None) -> None:
    Attempt.objects.create(
        scheduled_for=occ.scheduled_for, occurrence_id=occ.id, tenant_id=occ.tenant_id,
        attempt_no=1, lease_token=uuid.uuid4(), lease_expires_at=lease_expires_at,
        worker_id="test:1", started_at=lease_expires_at - timedelta(seconds=60),
        finished_at=finished_at, outcome="" if finished_at is None else "RETRY",
    )  # fmt: skip


def _sample(report: ReconcileReport, kind: str) -> list[tuple[Any, ...]]:
    return [
        (f.occurrence_id, f.schedule_id, f.version, f.scheduled_for, f.state, f.age_s)
        for f in report.samples.get(kind, [])
    ]


def _expected(occ: Occurrence, state: str, age_s: float) -> tuple[Any, ...]:
    return (str(occ.id), str(occ.schedule_id), occ.schedule_version,
            occ.scheduled_for.isoformat(), state, age_s)  # fmt: skip


def test_enqueued_too_long_fails_until_it_succeeds(tenant_a: Tenant) -> None:
    made = _world(tenant_a)
    stuck = _enqueued(made["utc4"], 15)  # enqueued 25 min before NOW, no attempt

    report = _audit()

    assert report.failed
    assert _failing_counts(report) == {"stuck_enqueued": 1}
    assert _sample(report, "stuck_enqueued") == [
        _expected(stuck, Occurrence.State.ENQUEUED, 1500.0)
    ]
    assert report.as_json()["ok"] is False

    _set(stuck, state=Occurrence.State.SUCCEEDED, finished_at=NOW)

    report = _audit()

    assert not report.failed
    assert _failing_counts(report) == {}
    assert report.as_json()["counts"]["stuck_enqueued"] == 0


def test_enqueued_within_the_bound_or_back_from_a_retry_passes(tenant_a: Tenant) -> None:
    made = _world(tenant_a)
    fresh = _enqueued(made["utc5"], 30)  # enqueued 10 min before NOW
    # First published 30 min ago, failed 2 min ago and republished: enqueued_at keeps the
    # first publish, the finished attempt tells that it is back in the queue since.
    retried = _enqueued(made["utc6"], 10, attempt_count=1)
    _attempt(retried, lease_expires_at=NOW, finished_at=NOW - timedelta(minutes=2))

    report = _audit()

    assert not report.failed
    assert _failing_counts(report) == {}

    # The same rows with a one-minute bound: both are seen.
    report = _audit(bounds=StuckBounds(enqueued_s=60, scheduled_s=300, running_s=300,
                                       materialize_lag_s=300))  # fmt: skip

    assert _failing_counts(report) == {"stuck_enqueued": 2}
    assert _sample(report, "stuck_enqueued") == [
        _expected(retried, Occurrence.State.ENQUEUED, 1800.0),
        _expected(fresh, Occurrence.State.ENQUEUED, 600.0),
    ]


def test_scheduled_past_due_fails_and_a_backing_off_publish_does_not(tenant_a: Tenant) -> None:
    made = _world(tenant_a)
    late = _occurrence(made["utc6"], 20)  # due 20 min before NOW, still in the outbox
    backing_off = _occurrence(made["utc7"], 20)  # due as long ago, the relay retries it soon
    for occ in (late, backing_off):
        _set(occ, state=Occurrence.State.SCHEDULED, enqueued_at=None, finished_at=None)
    _outbox(late, late.available_at)
    _outbox(backing_off, NOW + timedelta(seconds=10))

    report = _audit()

    assert _failing_counts(report) == {"stuck_scheduled": 1}
    assert _sample(report, "stuck_scheduled") == [
        _expected(late, Occurrence.State.SCHEDULED, 1200.0)
    ]


def test_retry_wait_past_due_or_without_an_outbox_row_fails(tenant_a: Tenant) -> None:
    made = _world(tenant_a)
    overdue = _occurrence(made["utc8"], 25)  # its retry was due 301 s before NOW
    waiting = _occurrence(made["utc9"], 25)  # its retry is due in a minute
    orphan = _occurrence(made["utc10"], 25)  # no outbox row: nothing will ever retry it
    for occ in (overdue, waiting, orphan):
        _set(occ, state=Occurrence.State.RETRY_WAIT, finished_at=None, attempt_count=1)
    _outbox(overdue, NOW - timedelta(seconds=301))
    _outbox(waiting, NOW + timedelta(minutes=1))

    report = _audit()

    assert _failing_counts(report) == {"stuck_scheduled": 2, "stranded": 1}
    assert _sample(report, "stuck_scheduled") == [
        _expected(orphan, Occurrence.State.RETRY_WAIT, 900.0),  # since its own available_at
        _expected(overdue, Occurrence.State.RETRY_WAIT, 301.0),
    ]
    assert [f.occurrence_id for f in report.samples["stranded"]] == [str(orphan.id)]


def test_running_past_lease_fails(tenant_a: Tenant) -> None:
    made = _world(tenant_a)
    abandoned = _occurrence(made["utc11"], 10)  # lease expired 301 s ago: no reaper
    reapable = _occurrence(made["utc12"], 10)  # lease expired 30 s ago: the reaper's turn
    for occ, expired in ((abandoned, 301), (reapable, 30)):
        _set(occ, state=Occurrence.State.RUNNING, finished_at=None, attempt_count=1)
        _attempt(occ, lease_expires_at=NOW - timedelta(seconds=expired), finished_at=None)

    report = _audit()

    assert _failing_counts(report) == {"stuck_running": 1}
    assert _sample(report, "stuck_running") == [
        _expected(abandoned, Occurrence.State.RUNNING, 301.0)
    ]


def test_stalled_materializer_fails_as_unmaterialized(tenant_a: Tenant, capsys: Any) -> None:
    made = _world(tenant_a)
    stalled = Schedule.objects.get(pk=made["utc13"].pk)
    behind = NOW - timedelta(minutes=10)
    Schedule.objects.filter(pk=stalled.pk).update(next_run_at=behind)
    # A paused schedule's next_run_at is not the materializer's to advance.
    Schedule.objects.filter(pk=made["paused"].pk).update(next_run_at=NOW - timedelta(hours=1))

    report = _audit()

    assert _failing_counts(report) == {"unmaterialized": 1}
    assert [
        (f.schedule_id, f.version, f.scheduled_for, f.occurrence_id, f.state, f.age_s)
        for f in report.samples["unmaterialized"]
    ] == [(str(stalled.id), stalled.version, behind.isoformat(), None, "ACTIVE", 600.0)]

    args = ["--from", START.isoformat(), "--to", END.isoformat(), "--json"]
    with time_machine.travel(NOW, tick=False), pytest.raises(SystemExit) as exited:
        call_command("reconcile", *args)

    assert exited.value.code == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False
    assert data["counts"]["unmaterialized"] == 1
    assert [(s["schedule_id"], s["age_s"]) for s in data["samples"]["unmaterialized"]] == [
        (str(stalled.id), 600.0)
    ]

    # A lag of ten minutes is within a bound of fifteen.
    with time_machine.travel(NOW, tick=False):
        call_command("reconcile", *args, "--materialize-lag", "900")

    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True
    assert data["counts"]["unmaterialized"] == 0
    assert data["stuck_bounds_s"] == {
        "enqueued_s": 900, "scheduled_s": 300, "running_s": 300, "materialize_lag_s": 900,
    }  # fmt: skip


def test_command_exits_non_zero_on_stuck_work_and_bounds_are_overridable(
    tenant_a: Tenant, capsys: Any
) -> None:
    made = _world(tenant_a)
    stuck = _enqueued(made["utc14"], 15)
    args = ["--from", START.isoformat(), "--to", END.isoformat()]

    with time_machine.travel(NOW, tick=False), pytest.raises(SystemExit) as exited:
        call_command("reconcile", *args)

    assert exited.value.code == 1
    out = capsys.readouterr().out
    assert "stuck_enqueued 1" in out
    assert f"'occurrence_id': '{stuck.id}'" in out
    assert out.rstrip().endswith("FAILED")

    # Twenty-five minutes is within a bound of thirty.
    with time_machine.travel(NOW, tick=False):
        call_command("reconcile", *args, "--enqueued-bound", "1800")

    out = capsys.readouterr().out
    assert "stuck_enqueued 0" in out
    assert out.rstrip().endswith("OK")


def test_stuck_work_is_scoped_to_the_window_and_the_tenant(
    tenant_a: Tenant, tenant_b: Tenant
) -> None:
    made = _world(tenant_a)
    _enqueued(made["utc15"], 15)
    assert _audit(tenant_id=tenant_a.id).counts["stuck_enqueued"] == 1

    assert _audit(tenant_id=tenant_b.id).counts["stuck_enqueued"] == 0
    later = reconcile(start=T0 + timedelta(minutes=20), end=END, now=NOW)
    assert _failing_counts(later) == {}


def test_unmaterialized_count_probes_the_due_index(tenant_a: Tenant) -> None:
    from apps.occurrences.audit.reconcile import _LATE_COUNT_SQL

    _world(tenant_a)
    params: dict[str, Any] = {
        "shards": settings.TICK_SHARDS, "active": Schedule.State.ACTIVE,
        "materialize_before": NOW,
    }  # fmt: skip
    with connection.cursor() as cursor:
        # The table is tiny here; what matters is that the partial index applies at all.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + _LATE_COUNT_SQL.format(tenant="", order_limit=""), params)
        plan = "\n".join(row[0] for row in cursor.fetchall())

    assert "schedule_due_idx" in plan, plan
    assert "Seq Scan on schedules_schedule" not in plan, plan
