"""Relay quotas and lane reservation, against the real database and broker."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from itertools import pairwise

import pytest
from django.utils import timezone

from apps.occurrences.models import DispatchOutbox, Lane, Occurrence, ShardLease
from apps.occurrences.pipeline.materializer import materialize_pass
from apps.occurrences.pipeline.relay import relay_step
from apps.occurrences.pipeline.throttle import DueRow, TenantThrottle, _Bucket
from apps.occurrences.tests.support.pipeline import leases, materialize_config, relay_config
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule
from apps.tenants.models import Tenant

pytestmark = [pytest.mark.django_db, pytest.mark.clock_edge]


def _due(tenant, count):
    run_at = timezone.now() - timedelta(seconds=1)
    for _ in range(count):
        make_schedule(
            tenant, kind=Schedule.Kind.ONE_SHOT, expression="", run_at=run_at, next_run_at=run_at
        )


@pytest.fixture
def throttle():
    throttle = TenantThrottle()
    yield throttle
    throttle.close()


def test_bucket_grants_its_rate_at_once_then_spaces_the_rest():
    bucket = _Bucket(rate=2.0, tokens=2.0, stamp=0.0)

    delays = [bucket.take(0.0) for _ in range(5)]

    assert delays == [0.0, 0.0, 0.5, 1.0, 1.5]
    assert bucket.take(10.0) == 0.0  # refilled (capped at one second's worth)


def test_a_tenant_over_its_trigger_rate_is_deferred_while_others_flow(
    tenant_a, tenant_b, queue_prefix, publisher, throttle
):
    # given: tenant A may fire 2 per second and has 5 due; tenant B has 3 due
    Tenant.objects.filter(pk=tenant_a.pk).update(trigger_rate_per_s=2)
    _due(tenant_a, 5)
    _due(tenant_b, 3)
    materialize_pass(leases=leases(), now=timezone.now(), config=materialize_config())

    # when
    result = relay_step(
        leases=leases(ShardLease.Role.RELAY),
        publisher=publisher,
        config=relay_config(queue_prefix),
        throttle=throttle,
    )

    # then: B entirely and A's first 2 are enqueued; A's other 3 wait in the outbox, spaced
    # half a second apart; nothing is dropped and occurrences keep their own available_at
    assert (result.published, result.deferred) == (5, 3)
    enqueued = Occurrence.objects.filter(state=Occurrence.State.ENQUEUED)
    assert enqueued.filter(tenant=tenant_b).count() == 3
    assert enqueued.filter(tenant=tenant_a).count() == 2
    waiting = list(DispatchOutbox.objects.filter(tenant_id=tenant_a.id).order_by("available_at"))
    assert len(waiting) == 3
    gaps = [(b.available_at - a.available_at).total_seconds() for a, b in pairwise(waiting)]
    assert gaps == pytest.approx([0.5, 0.5], abs=0.05)
    for row in waiting:
        occurrence = Occurrence.objects.get(id=row.occurrence_id)
        assert occurrence.available_at == occurrence.scheduled_for


def test_retry_and_catchup_lanes_get_a_bounded_share_of_a_step(tenant_a, queue_prefix, publisher):
    _due(tenant_a, 6)
    materialize_pass(leases=leases(), now=timezone.now(), config=materialize_config())
    # Four of the six become retries (e.g. after failures).
    retry_ids = list(DispatchOutbox.objects.values_list("id", flat=True)[:4])
    DispatchOutbox.objects.filter(id__in=retry_ids).update(lane=Lane.RETRY)
    config = replace(relay_config(queue_prefix), batch_size=5, background_share=0.2)

    result = relay_step(leases=leases(ShardLease.Role.RELAY), publisher=publisher, config=config)

    # 2 strict (all there are) + 1 retry (20 % of a batch of 5)
    assert result.published == 3
    assert DispatchOutbox.objects.filter(lane=Lane.RETRY).count() == 3


def test_relays_share_a_tenants_bucket(tenant_a, throttle):
    # given: a tenant that may fire 2 per second, and a second relay process's throttle
    Tenant.objects.filter(pk=tenant_a.pk).update(trigger_rate_per_s=2)
    other_relay = TenantThrottle()
    due = timezone.now()
    tenant = str(tenant_a.id)
    try:
        # when: each relay has 3 of the tenant's rows due now
        first = throttle.deferrals([DueRow(n, tenant, Lane.STRICT, due) for n in range(3)])
        second = other_relay.deferrals([DueRow(n, tenant, Lane.STRICT, due) for n in range(3, 6)])
    finally:
        other_relay.close()

    # then: 2 go now in all (one second's worth), the 4 others follow at 2 per second
    releases = first + second
    assert releases.count(None) == 2
    later = sorted(r for r in releases if r is not None)
    gaps = [(b - a).total_seconds() for a, b in pairwise(later)]
    assert gaps == pytest.approx([0.5] * 3, abs=0.01)


def test_rows_read_ahead_are_charged_at_their_instant(tenant_a, throttle):
    # given: a tenant that may fire 2 per second; the relay reads ahead
    Tenant.objects.filter(pk=tenant_a.pk).update(trigger_rate_per_s=2)
    soon = timezone.now() + timedelta(seconds=3)
    tenant = str(tenant_a.id)

    # when: 2 rows due in 3 s are read now, then 2 more due at the same instant
    early = throttle.deferrals([DueRow(n, tenant, Lane.STRICT, soon) for n in range(2)])
    late = throttle.deferrals([DueRow(n, tenant, Lane.STRICT, soon) for n in range(2, 4)])

    # then: the 3 s waited before the instant earn nothing: the next 2 wait for refills
    assert early == [None, None]
    assert [(r - soon).total_seconds() for r in late] == pytest.approx([0.5, 1.0], abs=0.01)
