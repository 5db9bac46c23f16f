"""Test helpers for the delivery path: lease sets and configs as the commands build them."""

from __future__ import annotations

from django.conf import settings

from apps.occurrences.models import ShardLease
from apps.occurrences.pipeline.leases import LeaseSet
from apps.occurrences.pipeline.materializer import MaterializeConfig
from apps.occurrences.pipeline.relay import RelayConfig


def leases(role: str = ShardLease.Role.MATERIALIZER, owner: str = "test-owner") -> LeaseSet:
    lease_set = LeaseSet(
        role=role, owner=owner, shards_total=settings.TICK_SHARDS, ttl_s=settings.TICK_LEASE_TTL_S
    )
    lease_set.refresh()
    return lease_set


def materialize_config(**overrides: int) -> MaterializeConfig:
    values = {
        "window_s": 120,
        "batch_size": 1000,
        "max_fires_per_pass": 200,
        "missed_record_limit": 10,
    }
    values.update(overrides)
    return MaterializeConfig(**values)


def relay_config(prefix: str) -> RelayConfig:
    return RelayConfig(
        lookahead_ms=500,
        batch_size=2000,
        envelope_max=50,
        prefix=prefix,
        partitions=settings.TICK_TENANT_PARTITIONS,
    )
