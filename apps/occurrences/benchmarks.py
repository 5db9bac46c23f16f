"""Burst benchmark of the delivery path (wrapped by `manage.py bench_burst`).

N strict cron schedules of T tenants all come due at one instant. The materializer writes
their occurrences ahead of time (as in production, inside its planning window); at the
instant, the relay publishes them to RabbitMQ with confirms. Reported: materializer rate,
relay rate, and the lag `enqueued_at - scheduled_for` (p50/p95/p99/max), overall and per
tenant. Real PostgreSQL and RabbitMQ; a private queue prefix; everything is removed after.
"""

from __future__ import annotations

import statistics
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from apps.occurrences.broker import Publisher
from apps.occurrences.leases import LeaseSet
from apps.occurrences.materializer import MaterializeConfig, materialize_pass
from apps.occurrences.partitions import partitions_ensure_for_range
from apps.occurrences.queues import all_queue_names, exchange_name
from apps.occurrences.relay import RelayConfig, relay_step
from apps.schedules.models import shard_for
from apps.tenants.services import tenant_create


@dataclass(frozen=True)
class BurstResult:
    schedules: int
    tenants: int
    materialize_s: float
    relay_s: float
    lag_p50_s: float
    lag_p95_s: float
    lag_p99_s: float
    lag_max_s: float
    worst_tenant_p99_s: float
    best_tenant_p99_s: float
    published: int

    def lines(self) -> list[str]:
        return [
            f"burst: {self.schedules:,} strict occurrences due at one instant, "
            f"{self.tenants} tenants",
            f"  materialize: {self.materialize_s:.2f} s "
            f"({self.schedules / self.materialize_s:,.0f} occurrences/s), ahead of the instant",
            f"  relay: {self.published:,} confirmed in {self.relay_s:.2f} s "
            f"({self.published / self.relay_s:,.0f} messages/s)",
            f"  lag enqueued_at - scheduled_for: p50 {self.lag_p50_s:.3f} s, "
            f"p95 {self.lag_p95_s:.3f} s, p99 {self.lag_p99_s:.3f} s, max {self.lag_max_s:.3f} s",
            f"  per-tenant p99: best {self.best_tenant_p99_s:.3f} s, "
            f"worst {self.worst_tenant_p99_s:.3f} s",
        ]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _create_schedules(tenant_ids: list[uuid.UUID], count: int, instant: datetime) -> None:
    """Bulk-insert `count` every-minute cron schedules ending right after `instant`, so each
    contributes exactly one strict occurrence at `instant`."""
    ids = [uuid.uuid4() for _ in range(count)]
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO schedules_schedule
                (id, tenant_id, name, kind, expression, run_at, time_zone, dst_gap, dst_fold,
                 start_at, end_at, precision, flexible_window_s, misfire_policy,
                 max_lateness_s, catchup_limit, overlap_policy, handler, payload, version,
                 state, next_run_at, shard, created_at, updated_at)
            SELECT s.id, s.tenant_id, 'bench', 'CRON', %s, NULL, 'UTC', 'skip',
                   'first', NULL, NULL, 'STRICT', 0, 'FIRE_ONCE', 60, 0, 'ALLOW', 'record',
                   '{}'::jsonb, 1, 'ACTIVE', %s, s.shard, now(), now()
            FROM unnest(%s::uuid[], %s::uuid[], %s::int[]) AS s(id, tenant_id, shard)
            """,
            [
                f"{instant.minute} {instant.hour} {instant.day} {instant.month} *",
                instant,
                ids,
                [tenant_ids[i % len(tenant_ids)] for i in range(count)],
                [shard_for(i, settings.TICK_SHARDS) for i in ids],
            ],
        )


def _cleanup(tenant_ids: list[uuid.UUID]) -> None:
    with connection.cursor() as cursor:
        for table in (
            "occurrences_dispatchoutbox",
            "occurrences_attempt",
            "occurrences_occurrence",
            "schedules_scheduleevent",
            "schedules_scheduleversion",
            "schedules_schedule",
            "tenants_tenant",
        ):
            column = "id" if table == "tenants_tenant" else "tenant_id"
            cursor.execute(f"DELETE FROM {table} WHERE {column} = ANY(%s)", [tenant_ids])


def bench_burst(
    *, schedules: int, tenants: int, lead_s: float = 20.0, celery_app: Any
) -> BurstResult:
    prefix = f"tick-bench-{uuid.uuid4().hex[:8]}"
    tenant_ids = [tenant_create(slug=f"bench-{prefix[-8:]}-{i}").id for i in range(tenants)]
    now = timezone.now()
    # The first minute boundary at least lead_s ahead: where '* * * * *' fires.
    instant = (now + timedelta(seconds=lead_s + 60)).replace(second=0, microsecond=0)
    partitions_ensure_for_range(now, instant + timedelta(days=1))
    publisher = Publisher(
        settings.CELERY_BROKER_URL,
        prefix=prefix,
        partitions=settings.TICK_TENANT_PARTITIONS,
        celery_app=celery_app,
    )
    owner = f"bench-{prefix}"
    mat_leases = LeaseSet("bench-mat", owner, settings.TICK_SHARDS, 120)
    relay_leases = LeaseSet("relay-bench", owner, settings.TICK_SHARDS, 120)
    try:
        _create_schedules(tenant_ids, schedules, instant)
        mat_leases.refresh()
        relay_leases.refresh()
        started = time.perf_counter()
        materialize_pass(
            leases=mat_leases,
            now=timezone.now(),
            config=MaterializeConfig(
                window_s=int(lead_s) + 120,
                batch_size=settings.TICK_MATERIALIZE_BATCH,
                max_fires_per_pass=settings.TICK_MAX_FIRES_PER_PASS,
                missed_record_limit=settings.TICK_MISSED_RECORD_LIMIT,
            ),
        )
        materialize_s = time.perf_counter() - started
        if timezone.now() >= instant:
            raise RuntimeError("materialization outlasted the lead time: raise --lead")
        publisher.connect()
        config = RelayConfig(
            lookahead_ms=settings.TICK_RELAY_LOOKAHEAD_MS,
            batch_size=settings.TICK_RELAY_BATCH,
            prefix=prefix,
            partitions=settings.TICK_TENANT_PARTITIONS,
        )
        while (instant - timezone.now()).total_seconds() > 1:
            time.sleep(0.05)
        started = time.perf_counter()
        published = 0
        while published < schedules:
            step = relay_step(leases=relay_leases, publisher=publisher, config=config)
            published += step.published
            if step.claimed == 0 and timezone.now() > instant + timedelta(seconds=120):
                break
        relay_s = time.perf_counter() - started - max(
            0.0, (instant - datetime.now(UTC)).total_seconds()
        )
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT tenant_id, EXTRACT(EPOCH FROM enqueued_at - scheduled_for) "
                "FROM occurrences_occurrence WHERE tenant_id = ANY(%s) AND scheduled_for = %s",
                [tenant_ids, instant],
            )
            rows = cursor.fetchall()
        lags = [float(lag) if lag is not None else float("inf") for _, lag in rows]
        by_tenant: dict[uuid.UUID, list[float]] = {}
        for tenant_id, lag in rows:
            by_tenant.setdefault(tenant_id, []).append(float(lag) if lag is not None else 1e9)
        tenant_p99 = [_quantile(v, 0.99) for v in by_tenant.values()]
        return BurstResult(
            schedules=schedules,
            tenants=tenants,
            materialize_s=materialize_s,
            relay_s=max(relay_s, 1e-6),
            lag_p50_s=statistics.median(lags),
            lag_p95_s=_quantile(lags, 0.95),
            lag_p99_s=_quantile(lags, 0.99),
            lag_max_s=max(lags),
            worst_tenant_p99_s=max(tenant_p99),
            best_tenant_p99_s=min(tenant_p99),
            published=published,
        )
    finally:
        channel = publisher._channel
        if channel is not None:
            for name in all_queue_names(prefix, settings.TICK_TENANT_PARTITIONS):
                channel.queue_delete(name)
            channel.exchange_delete(exchange_name(prefix))
        publisher.close()
        mat_leases.release()
        relay_leases.release()
        _cleanup(tenant_ids)
