"""A unit of work longer than the lease TTL keeps its shards: the heartbeat extends them."""

from __future__ import annotations

import time

import pytest
from django.db import transaction

from apps.occurrences.models import ShardLease
from apps.occurrences.pipeline.leases import LeaseHeartbeat, LeaseSet

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
