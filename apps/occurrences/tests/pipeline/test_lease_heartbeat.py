"""A unit of work longer than the lease TTL keeps its shards: the heartbeat extends them - and
the relay's step across a look-ahead wait longer than the TTL records what it published."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.occurrences.models import DispatchOutbox, Occurrence, ShardLease
from apps.occurrences.pipeline.leases import LeaseHeartbeat, LeaseSet
from apps.occurrences.pipeline.materializer import materialize_pass
from apps.occurrences.pipeline.relay import relay_step
from apps.occurrences.tests.support.pipeline import leases, materialize_config, relay_config
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule

pytestmark = pytest.mark.django_db(transaction=True)  # the heartbeat has its own connection

TTL_S = 2


def _held_after(seconds: float, *, heartbeat: bool) -> list[int]:
    leases = LeaseSet(role=ShardLease.Role.RELAY, owner="test-owner", shards_total=8, ttl_s=TTL_S)
    leases.refresh()
    beating = LeaseHeartbeat(leases) if heartbeat else None
    if beating is not None:
        beating.start()
    try:
        time.sleep(seconds)  # one long unit of work: no refresh meanwhile
        with transaction.atomic():
            return leases.fenced_shards()
    finally:
        if beating is not None:
            beating.stop()


def test_leases_outlive_a_unit_longer_than_their_ttl_with_the_heartbeat():
    assert _held_after(TTL_S * 2, heartbeat=True) == list(range(8))


def test_without_it_they_expire_and_fenced_work_finds_no_shard():
    assert _held_after(TTL_S * 1.5, heartbeat=False) == []


def _relay_across_a_long_wait(tenant, queue_prefix: str, publisher, *, heartbeat: bool):
    """One relay step whose look-ahead read a row due 7 s later (its lease TTL is 3 s),
    as the relay's loop runs it (loop.py: the heartbeat beside the step), or without it."""
    due = timezone.now() + timedelta(seconds=7)
    make_schedule(tenant, kind=Schedule.Kind.ONE_SHOT, expression="", run_at=due)
    materialize_pass(leases=leases(), now=timezone.now(), config=materialize_config())
    relay = LeaseSet(role=ShardLease.Role.RELAY, owner="relay", shards_total=settings.TICK_SHARDS,
                     ttl_s=3)  # fmt: skip
    relay.refresh()
    beating = LeaseHeartbeat(relay) if heartbeat else None
    if beating is not None:
        beating.start()
    try:
        config = replace(relay_config(queue_prefix), lookahead_ms=9000)
        return relay_step(leases=relay, publisher=publisher, config=config)
    finally:
        if beating is not None:
            beating.stop()


def test_the_relay_keeps_its_shards_through_a_look_ahead_wait_longer_than_the_lease_ttl(
    tenant_a, queue_prefix, publisher
):
    result = _relay_across_a_long_wait(tenant_a, queue_prefix, publisher, heartbeat=True)

    # Published and recorded under the fence: nothing left in the outbox to publish again.
    assert result.published == 1
    assert not DispatchOutbox.objects.exists()
    assert Occurrence.objects.get().state == Occurrence.State.ENQUEUED


def test_without_the_heartbeat_the_fence_is_lost_and_the_row_would_be_published_again(
    tenant_a, queue_prefix, publisher
):
    _relay_across_a_long_wait(tenant_a, queue_prefix, publisher, heartbeat=False)

    assert DispatchOutbox.objects.count() == 1
    assert Occurrence.objects.get().state == Occurrence.State.SCHEDULED
