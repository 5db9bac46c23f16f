from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import QuerySet
from django.test.utils import CaptureQueriesContext

from apps.occurrences.models import DispatchOutbox, Lane, Occurrence, occurrence_id_for
from apps.occurrences.pipeline.materializer import (
    FLEXIBLE_END_MARGIN_S,
    MaterializeConfig,
    flexible_available_at,
    flexible_spread_s,
    flexible_step_s,
    materialize_pass,
    span_cut,
)
from apps.occurrences.tests.support.pipeline import leases, materialize_config
from apps.schedules.models import Schedule, ScheduleEvent
from apps.schedules.tests.factories import make_schedule
from apps.tenants.models import Tenant

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 2, 12, 0, 30, tzinfo=UTC)


def _after_one_pass(
    tenant: Tenant, *, config: MaterializeConfig | None = None, **fields: Any
) -> Schedule:
    """A schedule made with `fields`, after one materialization pass at NOW."""
    schedule = make_schedule(tenant, **fields)
    materialize_pass(leases=leases(), now=NOW, config=config or materialize_config())
    return schedule


def _misfired(
    tenant: Tenant,
    policy: Schedule.MisfirePolicy,
    since: datetime,
    *,
    missed_record_limit: int = 10,
    **fields: Any,
) -> Schedule:
    """An every-minute schedule (60 s lateness allowed) due since `since` under `policy`,
    after one pass at NOW."""
    return _after_one_pass(
        tenant,
        config=materialize_config(missed_record_limit=missed_record_limit),
        misfire_policy=policy,
        max_lateness_s=60,
        next_run_at=since,
        **fields,
    )


def _instants(occurrences: QuerySet[Occurrence]) -> list[datetime]:
    return sorted(occurrences.values_list("scheduled_for", flat=True))


def test_due_cron_schedule_gets_occurrences_and_outbox_rows_inside_the_window(tenant_a):
    # given: an every-minute schedule due at 12:01
    schedule = make_schedule(tenant_a, next_run_at=datetime(2026, 12, 2, 12, 1, tzinfo=UTC))

    # when
    result = materialize_pass(leases=leases(), now=NOW, config=materialize_config(window_s=120))

    # then: 12:01 and 12:02 are inside now + 120 s; next_run_at moves to 12:03
    expected = [datetime(2026, 12, 2, 12, m, tzinfo=UTC) for m in (1, 2)]
    occurrences = Occurrence.objects.filter(schedule=schedule).order_by("scheduled_for")
    assert [o.scheduled_for for o in occurrences] == expected
    assert [o.id for o in occurrences] == [occurrence_id_for(schedule.id, 1, t) for t in expected]
    assert {o.state for o in occurrences} == {Occurrence.State.SCHEDULED}
    assert sorted(DispatchOutbox.objects.values_list("scheduled_for", flat=True)) == expected
    schedule.refresh_from_db()
    assert schedule.next_run_at == datetime(2026, 12, 2, 12, 3, tzinfo=UTC)
    assert (result.inserted, result.outboxed, result.conflicts) == (2, 2, 0)


def test_second_pass_writes_nothing_twice(tenant_a):
    make_schedule(tenant_a, next_run_at=datetime(2026, 12, 2, 12, 1, tzinfo=UTC))
    lease_set = leases()
    materialize_pass(leases=lease_set, now=NOW, config=materialize_config())

    again = materialize_pass(leases=lease_set, now=NOW, config=materialize_config())

    assert again.schedules == 0
    assert Occurrence.objects.count() == 2
    assert DispatchOutbox.objects.count() == 2


def test_rematerializing_an_instant_conflicts_instead_of_duplicating(tenant_a):
    # A crash after commit but before next_run_at moved is impossible (one transaction); a
    # stale copy of next_run_at (e.g. a restored row) must still not duplicate occurrences.
    schedule = make_schedule(tenant_a, next_run_at=datetime(2026, 12, 2, 12, 1, tzinfo=UTC))
    lease_set = leases()
    materialize_pass(leases=lease_set, now=NOW, config=materialize_config())
    Schedule.objects.filter(pk=schedule.pk).update(
        next_run_at=datetime(2026, 12, 2, 12, 1, tzinfo=UTC)
    )

    result = materialize_pass(leases=lease_set, now=NOW, config=materialize_config())

    assert (result.inserted, result.conflicts, result.outboxed) == (0, 2, 0)
    assert Occurrence.objects.count() == 2


def test_one_shot_materializes_once_and_completes(tenant_a):
    run_at = datetime(2026, 12, 2, 12, 1, 15, tzinfo=UTC)
    schedule = _after_one_pass(
        tenant_a, kind=Schedule.Kind.ONE_SHOT, expression="", run_at=run_at, next_run_at=run_at
    )

    schedule.refresh_from_db()
    assert schedule.state == Schedule.State.COMPLETED
    assert schedule.next_run_at is None
    assert list(Occurrence.objects.values_list("scheduled_for", flat=True)) == [run_at]
    assert ScheduleEvent.objects.filter(schedule=schedule, kind="completed").count() == 1


def test_flexible_available_at_is_stable_and_inside_the_window(tenant_a):
    schedule = _after_one_pass(
        tenant_a,
        precision=Schedule.Precision.FLEXIBLE,
        flexible_window_s=300,
        next_run_at=datetime(2026, 12, 2, 12, 1, tzinfo=UTC),
    )

    for occ in Occurrence.objects.filter(schedule=schedule):
        assert occ.lane == Lane.FLEXIBLE
        assert occ.available_at == flexible_available_at(occ.id, occ.scheduled_for, 300)
        offset = (occ.available_at - occ.scheduled_for).total_seconds()
        # planned at least the end margin before the window closes: a relay a few seconds
        # behind still enqueues it inside the window
        assert 0 <= offset < 300 - FLEXIBLE_END_MARGIN_S


def test_a_tenants_flexible_rows_of_one_minute_share_a_few_instants(tenant_a):
    # given: 200 flexible schedules of one tenant firing at the same minute, window 300 s
    for _ in range(200):
        make_schedule(
            tenant_a,
            precision=Schedule.Precision.FLEXIBLE,
            flexible_window_s=300,
            next_run_at=datetime(2026, 12, 2, 12, 1, tzinfo=UTC),
        )

    # when: one pass writes their rows
    materialize_pass(leases=leases(), now=NOW, config=materialize_config())

    # then: the rows of 12:01 are planned on 5-second steps of the window's first 290 s (one
    # envelope per step reaches a worker, not one per second), spread over most of them
    rows = Occurrence.objects.filter(scheduled_for=datetime(2026, 12, 2, 12, 1, tzinfo=UTC))
    offsets = [(at - datetime(2026, 12, 2, 12, 1, tzinfo=UTC)).total_seconds()
               for at in rows.values_list("available_at", flat=True)]  # fmt: skip
    assert len(offsets) == 200
    assert set(offsets) <= set(range(0, 290, 5))
    assert len(set(offsets)) > 40


_MINUTE = datetime(2026, 12, 2, 12, 1, tzinfo=UTC)
# (window, spread, step): short windows keep one-second steps, long ones at most five seconds
_WINDOWS = [(0, 0, 1), (1, 1, 1), (2, 1, 1), (7, 4, 1), (20, 10, 1), (21, 11, 1), (50, 40, 2),
            (60, 50, 2), (119, 109, 5), (300, 290, 5)]  # fmt: skip


@pytest.mark.parametrize(("window_s", "spread_s", "step_s"), _WINDOWS)
@pytest.mark.parametrize("scheduled_for", [_MINUTE, _MINUTE + timedelta(seconds=3.25)])
def test_a_flexible_row_is_planned_on_a_step_before_its_windows_end_margin(
    window_s, spread_s, step_s, scheduled_for
):
    ids = [uuid.uuid5(uuid.NAMESPACE_URL, f"flex-{n}") for n in range(5000)]
    planned = {flexible_available_at(i, scheduled_for, window_s) for i in ids}
    assert (flexible_spread_s(window_s), flexible_step_s(window_s)) == (spread_s, step_s)
    offsets = sorted((at - scheduled_for).total_seconds() for at in planned)
    assert 0 <= offsets[0] and offsets[-1] < max(1, spread_s)  # nothing past the spread
    if step_s > 1:  # on the step's multiples since the epoch, every one of the spread used
        assert all(at.timestamp() % step_s == 0 for at in planned)
        assert {b - a for a, b in zip(offsets, offsets[1:], strict=False)} == {step_s}
        assert offsets[0] < step_s and offsets[-1] >= spread_s - 2 * step_s
    else:  # whole seconds after the instant, every one of the spread used
        assert offsets == list(range(max(1, spread_s)))


def test_day_long_outage_with_skip_records_a_bounded_number_of_missed_rows(tenant_a):
    # given: an every-minute schedule whose next_run_at is a day old; when: one pass runs
    schedule = _misfired(tenant_a, Schedule.MisfirePolicy.SKIP, NOW - timedelta(days=1))

    # then: 10 MISSED rows (the latest), a summary event, nothing late fired, and the
    # on-time instants (now - 60 s .. now + 120 s) materialized normally
    missed = Occurrence.objects.filter(schedule=schedule, state=Occurrence.State.MISSED)
    assert missed.count() == 10
    assert _instants(missed)[-1] == datetime(2026, 12, 2, 11, 59, tzinfo=UTC)
    fired = Occurrence.objects.filter(schedule=schedule, state=Occurrence.State.SCHEDULED)
    assert _instants(fired) == [datetime(2026, 12, 2, 12, m, tzinfo=UTC) for m in (0, 1, 2)]
    event = ScheduleEvent.objects.get(schedule=schedule, kind="missed")
    assert event.detail["missed_count"] >= 11
    assert DispatchOutbox.objects.filter(lane=Lane.CATCHUP).count() == 0


def test_fire_once_fires_only_the_latest_late_instant_on_the_catchup_lane(tenant_a):
    since = datetime(2026, 12, 2, 11, 50, tzinfo=UTC)
    schedule = _misfired(tenant_a, Schedule.MisfirePolicy.FIRE_ONCE, since)

    catchup = Occurrence.objects.filter(
        schedule=schedule, lane=Lane.CATCHUP, state=Occurrence.State.SCHEDULED
    )
    assert _instants(catchup) == [datetime(2026, 12, 2, 11, 59, tzinfo=UTC)]
    missed = Occurrence.objects.filter(schedule=schedule, state=Occurrence.State.MISSED)
    assert _instants(missed) == [datetime(2026, 12, 2, 11, m, tzinfo=UTC) for m in range(50, 59)]


def test_catchup_fires_at_most_catchup_limit_latest_instants(tenant_a):
    since = datetime(2026, 12, 2, 11, 30, tzinfo=UTC)
    schedule = _misfired(
        tenant_a, Schedule.MisfirePolicy.CATCHUP, since, missed_record_limit=5, catchup_limit=3
    )

    catchup = Occurrence.objects.filter(
        schedule=schedule, lane=Lane.CATCHUP, state=Occurrence.State.SCHEDULED
    )
    assert _instants(catchup) == [datetime(2026, 12, 2, 11, m, tzinfo=UTC) for m in (57, 58, 59)]
    assert Occurrence.objects.filter(schedule=schedule, state=Occurrence.State.MISSED).count() == 5


def test_a_process_that_lost_its_lease_writes_nothing(tenant_a):
    make_schedule(tenant_a, next_run_at=datetime(2026, 12, 2, 12, 1, tzinfo=UTC))
    stale = leases(owner="stale")
    # The lease expires and another process takes every shard over (generation + 1).
    with connection.cursor() as cursor:
        cursor.execute("UPDATE occurrences_shardlease SET lease_expires_at = now() - interval '1s'")
    fresh = leases(owner="fresh")
    assert fresh.held and set(fresh.held) <= set(stale.held)  # a fair share, at new generations
    assert all(fresh.held[s] > stale.held[s] for s in fresh.held)

    result = materialize_pass(leases=stale, now=NOW, config=materialize_config())

    assert result.schedules == 0
    assert Occurrence.objects.count() == 0


def test_batch_query_count_does_not_grow_with_schedules(tenant_a):
    for _ in range(30):
        make_schedule(tenant_a, next_run_at=datetime(2026, 12, 2, 12, 1, tzinfo=UTC))
    lease_set = leases()
    materialize_pass(leases=lease_set, now=NOW, config=materialize_config())  # partitions
    for _ in range(30):
        make_schedule(tenant_a, next_run_at=datetime(2026, 12, 2, 12, 1, tzinfo=UTC))

    with CaptureQueriesContext(connection) as queries:
        result = materialize_pass(leases=lease_set, now=NOW, config=materialize_config())

    assert result.schedules == 30
    # fence + select + insert + advance per batch, plus the savepoint bookkeeping (the
    # pass's own and the insert's, which a conflict would undo)
    assert len(queries) <= 10, [q["sql"][:80] for q in queries]


@pytest.mark.parametrize(
    ("policy", "catchup_limit", "fired", "missed"),
    [
        (Schedule.MisfirePolicy.SKIP, 0, 0, 10),
        (Schedule.MisfirePolicy.FIRE_ONCE, 0, 1, 9),
        (Schedule.MisfirePolicy.CATCHUP, 3, 3, 7),
    ],
)
def test_ten_minute_outage_of_an_every_minute_schedule(
    tenant_a, policy, catchup_limit, fired, missed
):
    # given: the control plane was down from 11:50 to 12:00; at 12:00:00 the ten instants
    # 11:50 … 11:59 are older than now - max_lateness (30 s); 12:00 itself is on time
    now = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)
    schedule = make_schedule(
        tenant_a,
        misfire_policy=policy,
        catchup_limit=catchup_limit,
        max_lateness_s=30,
        next_run_at=datetime(2026, 12, 2, 11, 50, tzinfo=UTC),
    )

    materialize_pass(leases=leases(), now=now, config=materialize_config(window_s=30))

    late = Occurrence.objects.filter(schedule=schedule, scheduled_for__lt=now)
    assert late.filter(lane=Lane.CATCHUP, state="SCHEDULED").count() == fired
    assert late.filter(state=Occurrence.State.MISSED).count() == missed
    assert late.count() == 10
    # the latest instants are the ones fired
    fired_at = sorted(late.filter(state="SCHEDULED").values_list("scheduled_for", flat=True))
    assert fired_at == [datetime(2026, 12, 2, 11, 59 - k, tzinfo=UTC) for k in range(fired)][::-1]
    on_time = Occurrence.objects.get(schedule=schedule, scheduled_for=now)
    assert on_time.lane == Lane.STRICT


def test_a_pass_past_its_budget_hands_back_after_the_batch_and_the_next_goes_on(tenant_a):
    # given: five due schedules and batches of two
    for _ in range(5):
        make_schedule(tenant_a, next_run_at=datetime(2026, 12, 2, 12, 1, tzinfo=UTC))
    config = materialize_config(window_s=30, batch_size=2)

    # when: a pass whose time budget is already spent
    first = materialize_pass(leases=leases(), now=NOW, config=config, budget_s=0)

    # then: it stopped after one batch (the loop refreshes the leases), and the next pass
    # takes the rest
    assert first.schedules == 2
    rest = materialize_pass(leases=leases(), now=NOW, config=config, budget_s=0)
    rest += materialize_pass(leases=leases(), now=NOW, config=config)
    assert first.schedules + rest.schedules == 5
    assert Occurrence.objects.count() == 5


def test_instants_due_soonest_are_claimed_before_later_ones_across_shards(tenant_a):
    # given: one schedule due in 100 s in the first shard, one due now in the last: the due
    # index is read shard after shard, so only the time ranges put the sooner one first
    later = make_schedule(tenant_a, next_run_at=NOW + timedelta(seconds=100))
    sooner = make_schedule(tenant_a, next_run_at=NOW)
    Schedule.objects.filter(id=later.id).update(shard=0)
    Schedule.objects.filter(id=sooner.id).update(shard=255)

    # when: a batch of one
    materialize_pass(
        leases=leases(), now=NOW, config=materialize_config(window_s=120, batch_size=1),
        budget_s=0,
    )  # fmt: skip

    # then: the one due now went first
    assert set(Occurrence.objects.values_list("schedule_id", flat=True)) == {sooner.id}
    assert not Occurrence.objects.filter(schedule=later).exists()


def test_with_a_span_a_schedule_is_written_to_its_shard_cut_and_advanced_once_per_span(tenant_a):
    # given: two every-minute schedules due at 12:01, in shards 0 and 192 (phases 0 and
    # 180 s of a 240 s span); a window of 120 s and a span of 240 s
    first = make_schedule(tenant_a, next_run_at=datetime(2026, 12, 2, 12, 1, tzinfo=UTC))
    second = make_schedule(tenant_a, next_run_at=datetime(2026, 12, 2, 12, 1, tzinfo=UTC))
    Schedule.objects.filter(id=first.id).update(shard=0)
    Schedule.objects.filter(id=second.id).update(shard=192)
    config = materialize_config(window_s=120, span_s=240)
    lease_set = leases()

    def minutes(schedule: Schedule) -> list[int]:
        return [t.minute for t in _instants(Occurrence.objects.filter(schedule=schedule))]

    # when: a pass at 12:00:30 (horizon 12:06:30)
    taken = materialize_pass(leases=lease_set, now=NOW, config=config)

    # then: each is written up to its shard's cut (12:04 and 12:03), each with an outbox row
    assert taken.schedules == 2
    assert minutes(first) == [1, 2, 3, 4] and minutes(second) == [1, 2, 3]
    assert DispatchOutbox.objects.count() == 7
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.next_run_at == datetime(2026, 12, 2, 12, 5, tzinfo=UTC)
    assert second.next_run_at == datetime(2026, 12, 2, 12, 4, tzinfo=UTC)

    # and: neither is taken up again before its next instant enters the window
    at = datetime(2026, 12, 2, 12, 1, 30, tzinfo=UTC)
    assert materialize_pass(leases=lease_set, now=at, config=config).schedules == 0

    # when: 12:04 enters the window (12:02:00), then 12:05 (12:03:00)
    later = [datetime(2026, 12, 2, 12, 2, tzinfo=UTC), datetime(2026, 12, 2, 12, 3, tzinfo=UTC)]
    taken_again = [materialize_pass(leases=lease_set, now=t, config=config) for t in later]

    # then: each was taken up once more and written a whole span further, to the same phase
    assert [r.schedules for r in taken_again] == [1, 1]
    assert minutes(second) == [1, 2, 3, 4, 5, 6, 7]
    assert minutes(first) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert Occurrence.objects.filter(state=Occurrence.State.SCHEDULED).count() == 15
    assert DispatchOutbox.objects.count() == 15


def test_span_cut_lies_inside_the_last_span_before_the_horizon_at_the_shard_phase():
    horizon = datetime(2026, 12, 2, 12, 6, 30, tzinfo=UTC)
    cuts = [span_cut(shard, horizon, 240, 256) for shard in range(256)]

    assert all(horizon - timedelta(seconds=240) < cut <= horizon for cut in cuts)
    assert len(set(cuts)) == 256  # one phase per shard, spread over the span
    assert span_cut(0, horizon, 240, 256) == datetime(2026, 12, 2, 12, 4, tzinfo=UTC)
    assert span_cut(7, horizon, 0, 256) == horizon  # no span: the horizon itself
