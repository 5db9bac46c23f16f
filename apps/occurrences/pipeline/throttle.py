"""Per-tenant trigger-rate and catch-up-rate quotas for the relay
(docs/decisions.md "Quotas in the relay").

Token buckets in the relay process: a tenant's bucket refills at its rate and holds one
second's worth, so a tenant can fire `rate` occurrences at one instant and `rate` per second
after that. Rows over the quota are not dropped: the relay defers their outbox row
(`available_at` of the outbox row only; the occurrence keeps its own) to the instant the
bucket will allow them, so a throttled tenant waits while everyone else flows on.
With several relay processes each holds buckets for its own shards: a tenant's effective
rate is then up to (relays × rate) — documented, bounded, and exact with one relay.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import connection

from apps.occurrences.models import Lane
from apps.occurrences.observability import metrics
from apps.occurrences.observability.metrics import ThrottledBy


@dataclass
class _Bucket:
    rate: float
    tokens: float
    stamp: float

    def take(self, now: float) -> float:
        """Take one token; returns 0 if granted, else the seconds until one would be."""
        self.tokens = min(self.rate, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        # Reserve the token anyway: the caller defers the row to when it becomes available.
        self.tokens -= 1
        return -self.tokens / self.rate


@dataclass
class TenantThrottle:
    refresh_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    _quotas: dict[str, tuple[int, int]] = field(default_factory=dict)
    _loaded_at: float = float("-inf")
    _trigger: dict[str, _Bucket] = field(default_factory=dict)
    _catchup: dict[str, _Bucket] = field(default_factory=dict)
    # Outbox rows deferred with a token already reserved for their new instant.
    _reserved: set[int] = field(default_factory=set)

    def _refresh(self, now: float) -> None:
        if now - self._loaded_at < self.refresh_s:
            return
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id::text, trigger_rate_per_s, catchup_rate_per_s FROM tenants_tenant"
            )
            self._quotas = {tid: (int(t), int(c)) for tid, t, c in cursor.fetchall()}
        self._loaded_at = now
        for buckets, index in ((self._trigger, 0), (self._catchup, 1)):
            for tenant_id, bucket in buckets.items():
                rate = self._quotas.get(tenant_id, (0, 0))[index]
                bucket.rate = max(float(rate), 1.0)

    def delay_for(self, key: int, tenant_id: str, lane: str) -> float:
        """Seconds the outbox row `key` must wait for its tenant's quota (0: publish now)."""
        if key in self._reserved:
            self._reserved.discard(key)
            return 0.0
        now = self.clock()
        self._refresh(now)
        trigger_rate, catchup_rate = self._quotas.get(tenant_id, (0, 0))
        if trigger_rate <= 0:
            return 0.0  # unknown tenant (deleted?) or unlimited: never block delivery
        delay = self._bucket(self._trigger, tenant_id, trigger_rate, now).take(now)
        catchup = lane == Lane.CATCHUP
        if catchup and catchup_rate > 0:
            delay = max(delay, self._bucket(self._catchup, tenant_id, catchup_rate, now).take(now))
        if delay > 0:
            self._reserved.add(key)
            kind = ThrottledBy.CATCHUP_RATE if catchup else ThrottledBy.TRIGGER_RATE
            metrics.tenant_throttled.labels(kind=kind).inc()
        return delay

    @staticmethod
    def _bucket(buckets: dict[str, _Bucket], tenant_id: str, rate: int, now: float) -> _Bucket:
        bucket = buckets.get(tenant_id)
        if bucket is None:
            bucket = buckets[tenant_id] = _Bucket(float(rate), float(rate), now)
        return bucket
