"""The reconciliation audit: clean data passes, and every planted fault is found (issue 8)."""

from __future__ import annotations

import io
import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine
from django.core.management import call_command
from django.db import connection

from apps.occurrences.materializer import materialize_pass
from apps.occurrences.models import DispatchOutbox, Occurrence, occurrence_id_for
from apps.occurrences.reconcile import ReconcileReport, expected_cron_instants, reconcile
from apps.occurrences.tests.helpers import leases, materialize_config
from apps.schedules import timerules
from apps.schedules.models import Schedule
from apps.schedules.services import ScheduleSpec, schedule_pause, schedule_update
from apps.schedules.tests.factories import make_schedule
from apps.tenants.models import Tenant

pytestmark = pytest.mark.django_db

# Europe/Berlin springs forward at 01:00 UTC on 2026-03-29 (02:00 local does not exist).
T0 = datetime(2026, 3, 29, 0, 0, tzinfo=UTC)
START, END = T0 - timedelta(hours=2), T0 + timedelta(hours=4)


def _audit() -> ReconcileReport:
    return reconcile(start=START, end=END, chunk_size=7)


def _failing(report: ReconcileReport) -> set[tuple[str, str, str]]:
    return {
        (kind, f.schedule_id, f.scheduled_for)
        for kind in ("missing", "unexpected", "stranded")
        for f in report.samples.get(kind, [])
    }


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
    assert not report.failed
    counts = report.counts
    for kind in ("succeeded", "pending", "missed", "missed_summarised", "superseded",
                 "canceled", "unmaterialized"):  # fmt: skip
        assert counts[kind] > 0, (kind, report.as_json())
    assert report.schedules == 27
    assert report.stored == Occurrence.objects.count()


def test_every_planted_fault_is_found_and_nothing_else(tenant_a: Tenant) -> None:
    made = _world(tenant_a)
    assert not _audit().failed
    planted: set[tuple[str, str, str]] = set()
    rng = random.Random(8)

    # 1. delete 1 % of the occurrences (of ordinary runs: succeeded or pending)
    candidates = list(
        Occurrence.objects.filter(
            schedule__name__startswith="utc", state__in=["SUCCEEDED", "SCHEDULED"]
        ).values_list("id", "schedule_id", "scheduled_for")
    )
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
    call_command("reconcile", *args, "--tenant", tenant_a.slug)
    assert '"ok": true' in capsys.readouterr().out
    victim = Occurrence.objects.filter(schedule=made["utc3"], state="SUCCEEDED").first()
    assert victim is not None
    Occurrence.objects.filter(id=victim.id, scheduled_for=victim.scheduled_for).delete()

    with pytest.raises(SystemExit) as exited:
        call_command("reconcile", *args)

    assert exited.value.code == 1
    out = capsys.readouterr().out
    assert '"missing": 1' in out
    assert victim.scheduled_for.isoformat() in out


def test_recomputed_ids_equal_the_contracts_uuid5() -> None:
    from apps.occurrences.reconcile import expected_id_bytes

    sid = uuid.uuid4()
    for at in (T0, T0 + timedelta(microseconds=7), END):
        assert expected_id_bytes(str(sid), 3, at) == occurrence_id_for(sid, 3, at).bytes


def test_textfile_export_for_the_missing_occurrences_alert(tenant_a: Tenant, tmp_path: Any) -> None:
    _world(tenant_a)
    path = tmp_path / "tick_reconcile.prom"

    call_command(
        "reconcile", "--from", START.isoformat(), "--to", END.isoformat(), "--textfile",
        str(path), stdout=io.StringIO(),
    )  # fmt: skip

    text = path.read_text()
    assert 'tick_reconcile_findings{kind="missing"} 0' in text
    assert 'tick_reconcile_findings{kind="unexpected"} 0' in text
    assert "tick_reconcile_last_run_timestamp_seconds" in text
