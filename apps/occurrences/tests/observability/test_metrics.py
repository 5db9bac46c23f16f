"""Metrics move with the system: a burst moves the lag histogram and the backlog
gauges, a claim observes its start lag, a fenced-off completion is counted, the stuck-state
scan sees what is stuck."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone
from prometheus_client import REGISTRY, CollectorRegistry, Histogram

from apps.occurrences.audit.stuck import bounded_tenant_counts, stuck_scan
from apps.occurrences.execution.claim import ClaimStatus, occurrence_claim
from apps.occurrences.execution.complete import attempt_complete
from apps.occurrences.execution.reaper import attempts_reap
from apps.occurrences.models import DispatchOutbox, Lane, Occurrence, ShardLease
from apps.occurrences.observability import metrics
from apps.occurrences.observability.metrics import LAG_BUCKETS, measure_clock_skew
from apps.occurrences.pipeline.broker import Publisher
from apps.occurrences.pipeline.leases import LeaseSet
from apps.occurrences.pipeline.materializer import materialize_pass
from apps.occurrences.pipeline.relay import relay_step
from apps.occurrences.tests.support.pipeline import leases, materialize_config, relay_config
from apps.occurrences.tests.support.rows import occurrence, schedule, state_of
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule
from apps.tenants.models import Tenant

pytestmark = [pytest.mark.django_db, pytest.mark.clock_edge]


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _scan(**overrides: Any) -> Any:
    values: dict[str, Any] = {
        "now": timezone.now(),
        "shards": settings.TICK_SHARDS,
        "window_s": 120,
    }
    values.update(overrides)
    return stuck_scan(**values)


def test_a_burst_moves_the_lag_histogram_and_the_backlog_gauges(
    tenant_a: Tenant, queue_prefix: str, publisher: Publisher
) -> None:
    # given: 30 one-shots due one second ago, materialized
    run_at = timezone.now() - timedelta(seconds=1)
    for i in range(30):
        make_schedule(
            tenant_a, name=f"burst{i}", kind=Schedule.Kind.ONE_SHOT, expression="",
            run_at=run_at, next_run_at=run_at,
        )  # fmt: skip
    materialize_pass(leases=leases(), now=timezone.now(), config=materialize_config())
    lag_count = _value("tick_schedule_lag_seconds_count", lane="strict")
    lag_over_half_s = lag_count - _value(
        "tick_schedule_lag_seconds_bucket", lane="strict", le="0.5"
    )
    state_count = _value("tick_occurrence_state_seconds_count", state="SCHEDULED")

    # when: the scan sees the backlog
    before = _scan(broker_url=settings.CELERY_BROKER_URL, queue_prefix=queue_prefix,
                   partitions=settings.TICK_TENANT_PARTITIONS)  # fmt: skip

    # then
    assert before.due == {"1m": 30, "5m": 30, "15m": 30}
    assert _value("tick_due_backlog", bucket="1m") == 30
    assert _value("tick_outbox_oldest_age_seconds") >= 1.0
    assert before.queue_depth == {"strict": 0, "flexible": 0, "catchup": 0, "retry": 0}

    # when: the relay publishes the burst, and the scan runs again
    result = relay_step(
        leases=leases(ShardLease.Role.RELAY), publisher=publisher, config=relay_config(queue_prefix)
    )
    after = _scan(broker_url=settings.CELERY_BROKER_URL, queue_prefix=queue_prefix,
                  partitions=settings.TICK_TENANT_PARTITIONS)  # fmt: skip

    # then: 30 lag observations, all late by at least a second; the backlog is gone and the
    # messages wait in the strict queue
    assert result.published == 30
    assert _value("tick_schedule_lag_seconds_count", lane="strict") == lag_count + 30
    over = _value("tick_schedule_lag_seconds_count", lane="strict") - _value(
        "tick_schedule_lag_seconds_bucket", lane="strict", le="0.5"
    )
    assert over == lag_over_half_s + 30
    assert _value("tick_occurrence_state_seconds_count", state="SCHEDULED") == state_count + 30
    assert after.due == {"1m": 0, "5m": 0, "15m": 0}
    assert _value("tick_due_backlog", bucket="1m") == 0
    assert _value("tick_outbox_oldest_age_seconds") == 0
    assert after.queue_depth["strict"] >= 1  # envelopes: several occurrences per message
    assert _value("tick_queue_depth", lane="strict") == after.queue_depth["strict"]
    assert after.stuck_enqueued == 0
    assert after.queue_oldest_age_s > 0


def _claimed(tenant: Tenant) -> tuple[Occurrence, Any]:
    run_at = timezone.now() - timedelta(seconds=1)
    make_schedule(
        tenant, kind=Schedule.Kind.ONE_SHOT, expression="", run_at=run_at, next_run_at=run_at
    )
    materialize_pass(leases=leases(), now=timezone.now(), config=materialize_config())
    DispatchOutbox.objects.all().delete()
    occ = Occurrence.objects.get()
    claim = occurrence_claim(occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w")
    return occ, claim


def _start_lags(lane: str) -> tuple[float, float, float]:
    """count, sum and the <= 3 s bucket of tick_start_lag_seconds{lane}."""
    name = "tick_start_lag_seconds"
    return (
        _value(f"{name}_count", lane=lane),
        _value(f"{name}_sum", lane=lane),
        _value(f"{name}_bucket", lane=lane, le="3.0"),
    )


def test_a_claim_observes_the_start_lag_of_a_first_attempt_per_lane(tenant_a: Tenant) -> None:
    # given: a strict and a flexible occurrence of one instant; the flexible one became
    # available (its own due instant) a minute later
    at = (timezone.now() - timedelta(minutes=5)).replace(microsecond=0)
    strict = occurrence(schedule(tenant_a), at)
    flexible = occurrence(schedule(tenant_a), at)
    Occurrence.objects.filter(id=flexible.id).update(
        lane=Lane.FLEXIBLE, available_at=at + timedelta(seconds=60)
    )
    strict_before, flexible_before = _start_lags(Lane.STRICT), _start_lags(Lane.FLEXIBLE)

    # when: a worker opens the strict one's attempt 3.25 s after its instant, the flexible
    # one's 0.5 s after it became available
    late = occurrence_claim(occurrence_id=strict.id, scheduled_for=at, worker_id="w",
                            now=at + timedelta(seconds=3.25))  # fmt: skip
    prompt = occurrence_claim(occurrence_id=flexible.id, scheduled_for=at, worker_id="w",
                              now=at + timedelta(seconds=60.5))  # fmt: skip

    # then: one observation per lane, of exactly that lag
    assert (late.status, prompt.status) == (ClaimStatus.CLAIMED, ClaimStatus.CLAIMED)
    count, total, within_3s = _start_lags(Lane.STRICT)
    assert count == strict_before[0] + 1
    assert total == pytest.approx(strict_before[1] + 3.25)
    assert within_3s == strict_before[2]  # 3.25 s: past the 3 s bucket
    count, total, within_3s = _start_lags(Lane.FLEXIBLE)
    assert count == flexible_before[0] + 1
    assert total == pytest.approx(flexible_before[1] + 0.5)
    assert within_3s == flexible_before[2] + 1


def test_a_retry_attempt_is_not_a_start_lag_observation(tenant_a: Tenant) -> None:
    # given: attempt 1 opened, its worker lost, the reaper took it back
    at = (timezone.now() - timedelta(minutes=5)).replace(microsecond=0)
    occ = occurrence(schedule(tenant_a), at)
    occurrence_claim(occurrence_id=occ.id, scheduled_for=at, worker_id="w",
                     now=at + timedelta(seconds=1))  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute("UPDATE occurrences_attempt SET lease_expires_at = now() - interval '1 h'")
    assert attempts_reap(now=timezone.now(), grace_s=10).expired == 1
    assert state_of(occ) == Occurrence.State.RETRY_WAIT
    before = _start_lags(Lane.STRICT)

    # when: the retry opens attempt 2, minutes after the instant
    retry = occurrence_claim(occurrence_id=occ.id, scheduled_for=at, worker_id="w")

    # then: it started late by design and is not counted as a late start
    assert retry.status == ClaimStatus.CLAIMED and retry.context is not None
    assert retry.context.attempt_no == 2
    assert _start_lags(Lane.STRICT) == before


def test_a_fenced_off_completion_increments_its_counter(tenant_a: Tenant) -> None:
    occ, claim = _claimed(tenant_a)
    # The lease expired and the reaper took the occurrence back.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE occurrences_attempt SET lease_expires_at = now() - interval '1 h'")
    assert attempts_reap(now=timezone.now(), grace_s=10).expired == 1
    stale = _value("tick_stale_completions_total")

    assert attempt_complete(claim=claim) is None

    assert _value("tick_stale_completions_total") == stale + 1


def test_the_scan_finds_running_past_lease_old_outbox_rows_and_late_schedules(
    tenant_a: Tenant,
) -> None:
    # given: a RUNNING attempt whose lease ended a minute ago ...
    _claimed(tenant_a)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE occurrences_attempt SET lease_expires_at = now() - interval '60 s'")
    # ... an ACTIVE schedule an hour behind (the materializer is down) ...
    late = make_schedule(tenant_a, name="late", expression="* * * * *")
    Schedule.objects.filter(pk=late.pk).update(next_run_at=timezone.now() - timedelta(hours=1))
    # ... and an outbox row 10 minutes overdue
    materialize_pass(leases=leases(), now=timezone.now() - timedelta(minutes=10),
                     config=materialize_config(window_s=1))  # fmt: skip
    assert DispatchOutbox.objects.exists()

    result = _scan(top_tenants=1)

    assert result.stuck_running == 1
    assert result.stuck_schedules == 1  # still ~9 minutes behind after that pass
    assert result.stuck_outbox >= 1
    assert result.outbox_oldest_age_s >= 9 * 60
    assert result.stuck_outbox_by_tenant == {str(tenant_a.id): result.stuck_outbox}
    assert _value("tick_stuck", kind="running") == 1
    assert _value("tick_stuck_outbox_by_tenant", tenant=str(tenant_a.id)) == result.stuck_outbox

    Schedule.objects.filter(pk=late.pk).update(next_run_at=timezone.now() - timedelta(hours=1))
    again = _scan()
    assert again.stuck_schedules == 1
    assert again.materialization_lag_s >= 3600 + 120 - 5
    assert _value("tick_materialization_lag_seconds") == again.materialization_lag_s


def test_tenant_labels_are_bounded_to_top_n_plus_other() -> None:
    rows = [(f"t{i}", 100 - i) for i in range(50)]

    labels = bounded_tenant_counts(rows, 3)

    assert labels == {"t0": 100, "t1": 99, "t2": 98, "other": sum(100 - i for i in range(3, 50))}
    assert bounded_tenant_counts(rows[:2], 3) == {"t0": 100, "t1": 99}


def test_taking_over_an_expired_lease_of_another_owner_is_counted() -> None:
    role = ShardLease.Role.MATERIALIZER
    first = LeaseSet(role=role, owner="dead", shards_total=settings.TICK_SHARDS, ttl_s=15)
    first.refresh()
    ShardLease.objects.filter(role=role).update(lease_expires_at=timezone.now() - timedelta(1))
    from apps.occurrences.models import LeaseMember

    LeaseMember.objects.filter(owner="dead").delete()
    before = _value("tick_shard_lease_takeovers_total", role=role)

    second = LeaseSet(role=role, owner="alive", shards_total=settings.TICK_SHARDS, ttl_s=15)
    second.refresh()

    assert len(second.held) == settings.TICK_SHARDS
    assert _value("tick_shard_lease_takeovers_total", role=role) == before + settings.TICK_SHARDS


def test_clock_skew_against_the_database_is_measured() -> None:
    skew = measure_clock_skew("test")

    assert abs(skew) < 1.0
    assert _value("tick_clock_skew_seconds", process="test") == skew


def test_hot_path_tenant_labels_stop_growing_at_the_limit() -> None:
    from apps.occurrences.observability.metrics import TenantLabels

    label = TenantLabels(2)

    assert [label(t) for t in ("a", "b", "c", "a", "d")] == ["a", "b", "other", "a", "other"]


@pytest.mark.parametrize("value", [0.0, 0.3, 4.0, 7200.0])
def test_observe_many_records_what_as_many_observe_calls_would(value: float) -> None:
    registry = CollectorRegistry()
    one_by_one = Histogram("one_by_one", "", buckets=LAG_BUCKETS, registry=registry)
    together = Histogram("together", "", buckets=LAG_BUCKETS, registry=registry)

    for _ in range(7):
        one_by_one.observe(value)
    metrics.observe_many(together, value, 7)

    def samples(name: str) -> list[tuple[str, dict[str, str], float]]:
        [family] = [m for m in registry.collect() if m.name == name]
        return [(s.name.replace(name, ""), s.labels, s.value) for s in family.samples
                if not s.name.endswith("_created")]  # fmt: skip

    assert samples("together") == samples("one_by_one")
    assert ("_count", {}, 7.0) in samples("together")
