"""The sustained benchmark's plan, its figures from stored rows and its verdict, without
running the benchmark."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from apps.bench.pg_profile import Profile
from apps.bench.sustained import (
    FLEXIBLE_WINDOW_S,
    LaneFigures,
    MinuteRow,
    MinuteSamples,
    OutboxDepth,
    Reading,
    SpreadPlan,
    StoredFigures,
    _report,
    blocks_of,
    consumer_check,
    flatness_of,
    judge,
    minute_rows,
    minute_samples,
    outbox_depth,
    report_json,
    start_lag_verdict,
    stored_figures,
)
from apps.occurrences.models import DispatchOutbox, Lane, Occurrence
from apps.occurrences.pipeline.partitions import partitions_ensure
from apps.occurrences.tests.support.rows import schedule
from apps.schedules import timerules
from apps.schedules.models import Schedule
from apps.tenants.services import tenant_create

START = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)


def _due_per_minute(plan: SpreadPlan, minutes: int) -> dict[datetime, Counter[str]]:
    """How many of the plan's schedules fire in each minute from START, by precision,
    using Tick's rule code."""
    by_rule = Counter((p.expression, p.precision) for p in plan.schedules())
    due: dict[datetime, Counter[str]] = {}
    for (expression, precision), count in by_rule.items():
        for instant in timerules.fire_times_between(
            expression, "UTC", START - timedelta(microseconds=1),
            START + timedelta(minutes=minutes) - timedelta(microseconds=1),
        ):  # fmt: skip
            due.setdefault(instant, Counter())[precision] += count
    return due


@pytest.mark.parametrize(("per_minute", "share"), [(3000, 0.5), (1000, 0.3), (139_000, 0.5)])
def test_the_plan_brings_the_rate_due_every_minute_with_the_split(per_minute, share):
    plan = SpreadPlan(per_minute, share, tenants=10)
    due = _due_per_minute(plan, 15)
    assert sorted(due) == [START + timedelta(minutes=n) for n in range(15)]
    for counts in due.values():
        assert counts[Schedule.Precision.STRICT] + counts[Schedule.Precision.FLEXIBLE] == per_minute
        assert counts[Schedule.Precision.FLEXIBLE] == pytest.approx(per_minute * share, abs=1)
    windows = {p.window_s for p in plan.schedules() if p.precision == Schedule.Precision.FLEXIBLE}
    assert windows == {FLEXIBLE_WINDOW_S}


def test_the_plan_spreads_every_minute_offset_over_the_tenants():
    plan = SpreadPlan(3000, 0.5, tenants=10)
    per_tenant_rule = Counter((p.tenant, p.expression) for p in plan.schedules())
    for expression in {p.expression for p in plan.schedules()}:
        shares = [per_tenant_rule[(t, expression)] for t in range(10)]
        assert max(shares) - min(shares) <= 1, expression
    assert plan.schedule_count == sum(1 for _ in plan.schedules()) == 1500 + 1500 * 5


def _rows(
    sched: Schedule, lane: str, refs_and_lags: Sequence[tuple[datetime, float | None]]
) -> None:
    """Occurrence rows of `sched` whose reference instant and lag are given (flexible rows
    are scheduled 200 s before their available_at). Each row's instant is a few microseconds
    later than the one before: one schedule has one row per instant."""
    partitions_ensure([START.date()])
    rows = []
    for n, (at, lag) in enumerate(refs_and_lags):
        ref = at + timedelta(microseconds=n + 1)
        scheduled_for = ref - timedelta(seconds=200) if lane == Lane.FLEXIBLE else ref
        rows.append(
            Occurrence(
                id=uuid.uuid4(), scheduled_for=scheduled_for, schedule=sched,
                schedule_version=1, tenant_id=sched.tenant_id, lane=lane,
                state=Occurrence.State.ENQUEUED if lag is not None else Occurrence.State.SCHEDULED,
                available_at=ref, created_at=scheduled_for - timedelta(seconds=30),
                enqueued_at=None if lag is None else ref + timedelta(seconds=lag),
            )
        )  # fmt: skip
    Occurrence.objects.bulk_create(rows)


@pytest.mark.django_db
def test_stored_figures_per_minute_from_the_rows():
    tenant = tenant_create(slug="bench-figures")
    other = tenant_create(slug="bench-other")
    sched = schedule(tenant)
    minute_2 = START + timedelta(minutes=1)
    # Minute 1: 100 strict rows lagging 0.01 … 1.00 s (p99 0.99) and one enqueued 0.5 s early.
    _rows(sched, Lane.STRICT, [(START, n / 100) for n in range(1, 101)] + [(START, -0.5)])
    # Minute 2: strict lags 3 and 7 s, one not enqueued; flexible against available_at.
    _rows(sched, Lane.STRICT, [(minute_2, 3.0), (minute_2, 7.0), (minute_2, None)])
    _rows(sched, Lane.FLEXIBLE, [(minute_2 + timedelta(seconds=10), 0.2)] * 3)
    # A flexible row scheduled before START but available in minute 1 counts there.
    _rows(sched, Lane.FLEXIBLE, [(START + timedelta(seconds=5), 0.4)])
    # Outside the window, or another tenant's: not counted.
    _rows(sched, Lane.STRICT, [(START + timedelta(minutes=2), 99.0)])
    _rows(schedule(other), Lane.STRICT, [(START, 50.0)])

    figures = stored_figures([tenant.id], START, START + timedelta(minutes=2))

    first = figures.minutes[START]
    assert first[Lane.STRICT] == LaneFigures(
        count=101, enqueued=101, p99_s=0.99, max_s=1.0, early=1, materialized_late=0
    )
    assert first[Lane.FLEXIBLE].count == 1 and first[Lane.FLEXIBLE].p99_s == 0.4
    second = figures.minutes[minute_2]
    assert (second[Lane.STRICT].count, second[Lane.STRICT].enqueued) == (3, 2)
    assert second[Lane.STRICT].p99_s == 7.0
    assert second[Lane.FLEXIBLE].p99_s == 0.2 and second[Lane.FLEXIBLE].early == 0
    assert figures.overall[Lane.STRICT].count == 104
    assert figures.overall[Lane.STRICT].max_s == 7.0
    assert figures.overall[Lane.STRICT].early == 1
    # 100 strict rows and the flexible one; the early row was enqueued in the minute before.
    assert figures.enqueued_per_minute[START] == 101
    assert figures.enqueued_per_minute[minute_2] == 2 + 3


@pytest.mark.django_db
def test_a_row_written_after_its_instant_counts_as_materialized_late():
    tenant = tenant_create(slug="bench-late")
    _rows(schedule(tenant), Lane.STRICT, [(START, 0.1), (START, 0.2)])
    Occurrence.objects.filter(tenant_id=tenant.id).update(created_at=START + timedelta(seconds=1))
    figures = stored_figures([tenant.id], START, START + timedelta(minutes=1))
    assert figures.minutes[START][Lane.STRICT].materialized_late == 2


@pytest.mark.django_db
def test_a_flexible_row_enqueued_after_its_window_counts_as_past_window():
    tenant = tenant_create(slug="bench-past-window")
    # Scheduled 200 s before available_at: 100 s of lag reach the window's end (300 s).
    _rows(schedule(tenant), Lane.FLEXIBLE, [(START, 99.0), (START, 101.0), (START, 150.0)])
    _rows(schedule(tenant), Lane.STRICT, [(START, 400.0)])
    figures = stored_figures([tenant.id], START, START + timedelta(minutes=1))
    assert figures.minutes[START][Lane.FLEXIBLE].past_window == 2
    assert figures.minutes[START][Lane.STRICT].past_window == 0
    rows = minute_rows(START, 1, figures, [_samples(0)])
    assert rows[0].flexible_past_window == 2
    assert any("2 flexible enqueued after their window" in r for r in judge(rows, missing=0))


@pytest.mark.django_db
def test_consumer_check_finds_the_missing_and_the_duplicates(tmp_path: Path):
    tenant = tenant_create(slug="bench-consumer")
    _rows(schedule(tenant), Lane.STRICT, [(START, 0.1)] * 4 + [(START, None)])
    ids = [
        str(i) for i in Occurrence.objects.filter(
            tenant_id=tenant.id, enqueued_at__isnull=False).values_list("id", flat=True)
    ]  # fmt: skip
    received = tmp_path / "received.txt"
    # The first enqueued row never arrived, the second arrived three times; an unknown id
    # (outside the window) is neither.
    lines = [ids[1], ids[1], ids[1], ids[2], ids[3], str(uuid.uuid4())]
    received.write_text("\n".join(lines) + "\n")
    end = START + timedelta(minutes=1)
    assert consumer_check([tenant.id], START, end, received) == (1, 2)


def _reading(cpu: float, partitions: set[str]) -> Reading:
    return Reading({"relay": cpu, "postgresql": 2 * cpu}, "0/0", int(cpu * 100), 0, partitions)


@pytest.mark.django_db
def test_outbox_depth_reports_how_long_the_oldest_due_row_has_waited():
    # given: a row due 30 s ago, one due 3 s ago, one due in a minute, and a parked one older
    # than all of them
    now = timezone.now()

    def row(available_at: datetime, *, parked: bool = False) -> None:
        DispatchOutbox.objects.create(
            occurrence_id=uuid.uuid4(), scheduled_for=available_at, schedule_id=uuid.uuid4(),
            schedule_version=1, tenant_id=uuid.uuid4(), shard=0, lane=Lane.STRICT,
            available_at=available_at, created_at=now, parked_at=now if parked else None,
        )  # fmt: skip

    row(now - timedelta(seconds=30))
    row(now - timedelta(seconds=3))
    row(now + timedelta(minutes=1))
    row(now - timedelta(hours=1), parked=True)

    depth = outbox_depth()

    # then: parked rows are not the relay's; the oldest due one waited 30 s (plus the time
    # since `now`)
    assert (depth.rows, depth.overdue) == (3, 2)
    assert 30.0 <= depth.oldest_due_s < 40.0


@pytest.mark.django_db
def test_an_outbox_without_due_rows_is_not_late():
    assert outbox_depth() == OutboxDepth(0, 0, 0.0)


def test_minute_samples_diff_two_readings():
    before = _reading(1.0, {"occurrences_occurrence_p20260104", "occurrences_occurrence_p20260105"})
    after = _reading(3.5, {"occurrences_occurrence_p20260105", "occurrences_occurrence_p20260106"})
    depths = [OutboxDepth(10, 0, 0.0), OutboxDepth(40, 7, 3.25), OutboxDepth(25, 2, 1.5)]
    sample = minute_samples(before, after, depths, wal_bytes=4096)
    assert sample.cpu_s == {"postgresql": 5.0, "relay": 2.5}
    assert sample.partitions_created == ["occurrences_occurrence_p20260106"]
    assert sample.partitions_dropped == ["occurrences_occurrence_p20260104"]
    assert (sample.outbox_max, sample.outbox_last, sample.due_backlog_max) == (40, 25, 7)
    assert sample.oldest_due_s_max == 3.25
    assert sample.occurrence_growth_bytes == 250 and sample.wal_bytes == 4096


def _samples(oldest_due_s: float) -> MinuteSamples:
    return MinuteSamples({}, 0, 0, 0, [], [], 0, 0, 0, oldest_due_s)


def _minute_rows(
    p99s: list[float], oldest_due_s: list[float], **strict: LaneFigures
) -> list[MinuteRow]:
    figures = StoredFigures()
    for n, p99 in enumerate(p99s):
        lanes: dict[str, LaneFigures] = {
            Lane.STRICT: LaneFigures(count=100, enqueued=100, p99_s=p99)
        }
        figures.minutes[START + timedelta(minutes=n)] = lanes
    return minute_rows(START, len(p99s), figures, [_samples(b) for b in oldest_due_s])


def test_a_steady_run_held():
    assert judge(_minute_rows([0.5, 4.9, 1.0], [1.2, 0.4, 10.0]), missing=0) == []


def test_a_steady_backlog_of_a_second_holds_at_any_rate():
    # A low rate's steady backlog: about a second's rows due, each for about a second; a
    # count judged against one second's occurrences (30 at 1,800 a minute) read it as not held.
    rows = _minute_rows([0.5] * 10, [1.1] * 10)
    for row in rows:
        row.due_backlog_max = 62
    assert judge(rows, missing=0) == []


def test_a_start_lag_past_ten_seconds_breaks_the_hold():
    assert start_lag_verdict(None) == "" and start_lag_verdict(10.0) == ""
    assert start_lag_verdict(10.2) == "start lag p99 10.2 s > 10.0 s"


def test_one_slow_minute_breaks_the_hold():
    reasons = judge(_minute_rows([0.5, 5.2, 1.0], [0, 0, 0]), missing=0)
    assert len(reasons) == 1 and "strict p99 5.2" in reasons[0]


def test_a_late_outbox_row_early_and_missing_rows_break_the_hold():
    rows = _minute_rows([0.5, 0.5, 0.5], [0.5, 10.5, 0.5])
    rows[1].early = 2
    reasons = judge(rows, missing=3)
    assert [r for r in reasons if "relay behind" in r] == [
        f"{rows[1].minute}: an outbox row due 10.5 s ago > 10.0 s (relay behind)"
    ]
    assert "2 enqueued early" in reasons and "3 missing (reconcile)" in reasons


def test_unenqueued_strict_rows_and_late_materialization_break_the_hold():
    rows = _minute_rows([0.5, 0.5], [0, 0])
    rows[0].strict_enqueued = 98
    rows[1].materialized_late = 5
    reasons = judge(rows, missing=0)
    assert len(reasons) == 2
    assert "2 strict not enqueued" in reasons[0] and "5 materialized after due" in reasons[1]


def test_minute_rows_fill_empty_minutes_with_zeros():
    rows = minute_rows(START, 2, StoredFigures(), [_samples(0), _samples(0)])
    assert [(r.strict, r.strict_p99_s, r.flexible) for r in rows] == [(0, None, 0)] * 2
    assert rows[1].minute == (START + timedelta(minutes=1)).isoformat()
    assert timezone.is_aware(datetime.fromisoformat(rows[0].minute))


def test_the_summary_takes_the_worst_minute_sums_cpu_and_counts_audit_findings():
    figures = StoredFigures()
    for n, p99 in enumerate([0.4, 2.5]):
        figures.minutes[START + timedelta(minutes=n)] = {
            Lane.STRICT: LaneFigures(count=10, enqueued=10, p99_s=p99)
        }
    figures.overall[Lane.STRICT] = LaneFigures(count=20, enqueued=20, p99_s=2.4, early=0)
    figures.overall[Lane.FLEXIBLE] = LaneFigures(count=6, enqueued=5, p99_s=0.3)
    samples = [
        MinuteSamples({"relay": 1.5}, 100, 0, 0, [], [], 0, 0, 0),
        MinuteSamples({"relay": 2.0}, 50, 0, 0, ["occurrences_occurrence_p20260106"], [], 0, 0, 0),
    ]
    report = _report(
        SpreadPlan(20, 0.5, 2), figures, samples, start=START, minutes=2, warmup_minutes=0,
        materializers=1, relays=1, counts={"missing": 0, "pending": 26, "unexpected": 2},
        consumer_missing=1, duplicates=0, received=25, profile=Profile(False), floor=None,
    )  # fmt: skip
    assert report.worst_minute_strict_p99_s == 2.5 and report.strict_p99_s == 2.4
    assert report.not_enqueued == 1 and report.cpu_s == {"relay": 3.5}
    assert report.wal_bytes == 150
    assert report.partitions_created == ["occurrences_occurrence_p20260106"]
    assert not report.held
    assert report.not_held_because == ["2 unexpected (reconcile)", "1 enqueued but never received"]
    assert report_json(report).startswith("{") and "  held: False" in "\n".join(report.lines())


def test_execution_work_splits_the_workers_backends_by_statement_time():
    from apps.bench.execution_path import (
        BareCeleryFloor,
        ExecutionWork,
        StoredExecution,
    )
    from apps.bench.pg_profile import Phase, Profile, StatementFigures

    def statement(phase: str, total_ms: float) -> StatementFigures:
        return StatementFigures("q", phase, 1, total_ms, total_ms, 1, 0, 0)

    profile = Profile(True, [statement(Phase.CLAIM, 300.0), statement(Phase.COMPLETE, 100.0)])
    stored = StoredExecution(executed_per_minute={"2026-01-04T00:00:00+00:00": 1000})
    bare = BareCeleryFloor(1, 2, 1000, 1000, 60.0, {}, cpu_us_per_task=500.0)
    work = ExecutionWork.of(
        workers=1, concurrency=2, stored=stored, minutes=1, profile=profile, bare=bare,
        backend_cpu_s={"materialize": 0.05, "relay": 0.02, "worker": 0.4, "bench": 0.01},
        cpu_s={"postgresql": 0.6, "worker_pool": 0.4, "rabbitmq": 0.1, "bench": 9.0},
    )  # fmt: skip
    phases = work.pg_us_per_phase
    assert (phases["materialize"], phases["relay"]) == (50.0, 20.0)
    assert (phases["claim"], phases["complete"], phases["claim+complete"]) == (300.0, 100.0, 400.0)
    assert phases["rest of the server"] == 120.0 and phases["bench's own backend"] == 10.0
    assert phases["all"] == 600.0
    # The bench process itself is not Tick's cost.
    assert work.tick_cpu_us == 1100.0 and work.ratio_to_bare == 2.2
    # ... and the bench's own backend (its samples) is shown apart.
    assert work.tick_cpu_us_net == 1090.0 and work.ratio_to_bare_net == 2.18


def _work_rows(cpu_s: list[float], wal_bytes: list[int], enqueued: int = 1000) -> list[MinuteRow]:
    samples = [
        MinuteSamples({"postgresql": cpu, "relay": 9.0}, wal, 0, 0, [], [], 0, 0, 0)
        for cpu, wal in zip(cpu_s, wal_bytes, strict=True)
    ]
    rows = minute_rows(START, len(samples), StoredFigures(), samples)
    for row in rows:
        row.enqueued = enqueued
    return rows


def test_a_short_run_reports_no_blocks_and_no_flatness():
    rows = _work_rows([0.2] * 9, [4096_000] * 9)
    assert blocks_of(rows) == [] and flatness_of(rows) is None


def test_blocks_of_five_minutes_divide_postgresql_cpu_and_wal_by_the_enqueued():
    rows = _work_rows([0.2] * 5 + [0.3] * 5 + [0.4] * 2, [2048 * 1000] * 12)
    blocks = blocks_of(rows)
    assert [b.minutes for b in blocks] == ["1-5", "6-10", "11-12"]
    assert [b.cpu_us for b in blocks] == [200.0, 300.0, 400.0]
    assert [b.enqueued for b in blocks] == [5000, 5000, 2000]
    assert blocks[0].wal_kb == 2.0


def test_flatness_compares_the_first_five_minutes_with_the_last_five():
    steady = flatness_of(_work_rows([0.2] * 6 + [0.235] * 6, [4096_000] * 12))
    assert steady is not None and steady.flat and steady.wal_flat
    assert steady.first.minutes == "1-5" and steady.last.minutes == "8-12"
    assert steady.cpu_change == 0.175
    rising = flatness_of(_work_rows([0.2] * 5 + [0.3] * 5, [4096_000] * 5 + [2048_000] * 5))
    assert rising is not None and not rising.flat and rising.cpu_change == 0.5
    assert not rising.wal_flat and rising.wal_change == -0.5
    assert "NOT flat" in rising.lines()[0]


def test_flatness_without_occurrences_in_a_block_is_not_flat():
    rows = _work_rows([0.2] * 10, [4096_000] * 10)
    for row in rows[:5]:
        row.enqueued = 0
    flatness = flatness_of(rows)
    assert flatness is not None and flatness.cpu_change is None and not flatness.flat
