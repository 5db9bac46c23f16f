"""Per-tenant trigger-rate and catch-up-rate quotas for the relay
(docs/decisions.md "Quotas in the relay").

Token buckets shared by every relay process: one row per tenant and kind in
`occurrences_tenantratebucket`. A tenant's bucket refills at its rate and holds one second's
worth, so a tenant can fire `rate` occurrences at one instant and `rate` per second after
that, however many relays publish its shards. A relay step takes the tokens of its whole
batch in ONE upsert (all tenants of the batch, never one statement per row) on a private
autocommit connection: the step's own transaction holds the shard fence until its last
publish, and a bucket row locked that long would stall the other relays. The statement
returns each bucket's level before the take; the per-row grant or delay is then worked out
here, exactly as if the rows had taken their tokens one by one.
Rows over the quota are not dropped: the relay defers their outbox row (`available_at` of the
outbox row only; the occurrence keeps its own) to the instant the bucket will allow them, so
a throttled tenant waits while everyone else flows on. A deferred row has reserved its token
(the level goes negative); the relay that deferred it lets it through when it comes back.
"""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol

from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper

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


# Take `n` tokens from each (tenant, kind) bucket at the instant its rows are due: the later
# of the database clock and the earliest row's `available_at`. A bucket's clock (`stamp`)
# follows those instants, so rows read ahead (the relay's look-ahead) are charged when they
# go, not when they are read; a new bucket starts full. EXCLUDED.rate - EXCLUDED.tokens is
# `n`. Rows are locked in (tenant, kind) order, so two relays' steps never deadlock.
_TAKE = """
    INSERT INTO occurrences_tenantratebucket AS b (tenant_id, kind, rate, tokens, stamp)
    SELECT t.tenant_id, t.kind, t.rate, t.rate - t.n, greatest(now(), t.instant)
    FROM unnest(%s::uuid[], %s::text[], %s::float8[], %s::int[], %s::timestamptz[])
        AS t(tenant_id, kind, rate, n, instant)
    ORDER BY t.tenant_id, t.kind
    ON CONFLICT (tenant_id, kind) DO UPDATE
    SET tokens = least(EXCLUDED.rate, b.tokens + EXCLUDED.rate
                       * greatest(0, extract(epoch FROM EXCLUDED.stamp - b.stamp)))
                 - (EXCLUDED.rate - EXCLUDED.tokens),
        rate = EXCLUDED.rate,
        stamp = greatest(b.stamp, EXCLUDED.stamp)
    RETURNING b.tenant_id::text, b.kind, b.tokens, b.stamp
"""

Charge = tuple[str, ThrottledBy]  # (tenant id, bucket kind)


class Due(Protocol):
    """What the throttle reads of a due outbox row (relay.OutboxRow has it)."""

    @property
    def id(self) -> int: ...  # the outbox id
    @property
    def tenant_id(self) -> str: ...
    @property
    def lane(self) -> str: ...
    @property
    def available_at(self) -> datetime: ...


class DueRow(NamedTuple):
    id: int
    tenant_id: str
    lane: str
    available_at: datetime


@dataclass
class _Taken:
    """A bucket just before this step's take (its level, no refill) and the bucket's clock."""

    bucket: _Bucket
    at: datetime


@dataclass
class TenantThrottle:
    refresh_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    _quotas: dict[str, tuple[int, int]] = field(default_factory=dict)
    _loaded_at: float = float("-inf")
    # Outbox rows deferred with a token already reserved for their new instant.
    _reserved: set[int] = field(default_factory=set)
    _db: BaseDatabaseWrapper | None = None

    def _refresh(self, now: float) -> None:
        if now - self._loaded_at < self.refresh_s:
            return
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id::text, trigger_rate_per_s, catchup_rate_per_s FROM tenants_tenant"
            )
            self._quotas = {tid: (int(t), int(c)) for tid, t, c in cursor.fetchall()}
        self._loaded_at = now

    def deferrals(self, rows: Sequence[Due]) -> list[datetime | None]:
        """For each row (ascending `available_at`): None if its tenant's quotas let it go at
        its instant, else the instant they will; one shared-bucket statement per batch."""
        self._refresh(self.clock())
        # The rows charging each bucket, in order (positions in `rows`).
        charged: dict[Charge, list[int]] = defaultdict(list)
        for n, row in enumerate(rows):
            if row.id in self._reserved:
                self._reserved.discard(row.id)
                continue
            quotas = self._quotas.get(row.tenant_id)
            if quotas is None or quotas[0] <= 0:
                continue  # unknown tenant (deleted?) or unlimited: never block delivery
            charged[(row.tenant_id, ThrottledBy.TRIGGER_RATE)].append(n)
            if row.lane == Lane.CATCHUP and quotas[1] > 0:
                charged[(row.tenant_id, ThrottledBy.CATCHUP_RATE)].append(n)
        releases: list[datetime | None] = [None] * len(rows)
        if not charged:
            return releases
        taken = self._take(
            Counter({c: len(ns) for c, ns in charged.items()}),
            {c: rows[ns[0]].available_at for c, ns in charged.items()},
        )
        for charge, positions in charged.items():
            bucket = taken[charge].bucket
            if bucket.tokens >= len(positions):
                continue  # the common case: the whole batch fits, no row is looked at
            granted = max(0, math.floor(bucket.tokens))  # the first rows find whole tokens
            bucket.tokens -= granted
            for n in positions[granted:]:
                at = taken[charge].at + timedelta(seconds=bucket.take(0.0))
                current = releases[n]
                releases[n] = at if current is None else max(current, at)
        for n, release in enumerate(releases):
            if release is None:
                continue
            row = rows[n]
            if release <= row.available_at:
                releases[n] = None  # the bucket allows it by its own instant
                continue
            self._reserved.add(row.id)
            catchup = row.lane == Lane.CATCHUP
            kind = ThrottledBy.CATCHUP_RATE if catchup else ThrottledBy.TRIGGER_RATE
            metrics.tenant_throttled.labels(kind=kind).inc()
        return releases

    def _rate(self, charge: Charge) -> float:
        trigger_rate, catchup_rate = self._quotas[charge[0]]
        return float(trigger_rate if charge[1] == ThrottledBy.TRIGGER_RATE else catchup_rate)

    def _take(self, wanted: Counter[Charge], first: dict[Charge, datetime]) -> dict[Charge, _Taken]:
        """Take the tokens `wanted` from the shared buckets (module docstring)."""
        charges = sorted(wanted)
        params: list[Any] = [
            [tenant_id for tenant_id, _ in charges],
            [str(kind) for _, kind in charges],
            [self._rate(charge) for charge in charges],
            [wanted[charge] for charge in charges],
            [first[charge] for charge in charges],
        ]
        after = self._execute(params)
        return {
            charge: _Taken(
                _Bucket(self._rate(charge), after[charge][0] + wanted[charge], 0.0),
                after[charge][1],
            )
            for charge in charges
        }

    def _execute(self, params: list[Any]) -> dict[Charge, tuple[float, datetime]]:
        """Run `_TAKE` on the private connection. A connection the server dropped (a restart
        while it sat idle: the loop only renews its own) is replaced once, so the outage the
        loop already rode out does not fail the next step (a failed statement took nothing)."""
        for retry in (True, False):
            if self._db is None:
                self._db = connections.create_connection(DEFAULT_DB_ALIAS)
            try:
                with self._db.cursor() as cursor:
                    cursor.execute(_TAKE, params)
                    return {(tid, ThrottledBy(kind)): (t, at) for tid, kind, t, at in cursor}
            except (OperationalError, InterfaceError):
                self.close()
                if not retry:
                    raise
            except Exception:
                self.close()
                raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the private connection (the relay's shutdown)."""
        if self._db is not None:
            self._db.close()
            self._db = None
