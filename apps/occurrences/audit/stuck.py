"""The online stuck-state scan: cheap, set-based queries that feed the gauges of
metrics.py. Run by `manage.py reap` every `--scan-interval` seconds; one process is enough
(several only repeat the same reads).

What it measures (docs/operations.md explains each metric and its alert):
1. Outbox: due backlog per bucket (1/5/15 min ahead), oldest due row's age, rows older than
   the bound (also per tenant, top-N + "other"), parked rows.
2. Occurrences ENQUEUED for longer than the bound (only the recent `lookback`, so the scan
   reads one or two day partitions, never the whole history) and the oldest of them: the
   queue's oldest-message age as seen from the database.
3. Attempts RUNNING past lease + grace (through `attempt_open_lease_idx`).
4. ACTIVE schedules whose next_run_at lies more than the bound in the past, and the
   materialization lag, by one index probe per shard of `schedule_due_idx`.
5. RabbitMQ queue depth per lane (passive declares), when a broker URL is given.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from apps.occurrences.models import Occurrence
from apps.occurrences.observability import metrics
from apps.schedules.models import Schedule

BUCKETS = (("1m", 60), ("5m", 300), ("15m", 900))
_ACTIVE = Schedule.State.ACTIVE.value


@dataclass
class ScanResult:
    due: dict[str, int] = field(default_factory=dict)
    outbox_oldest_age_s: float = 0.0
    stuck_outbox: int = 0
    parked: int = 0
    stuck_enqueued: int = 0
    queue_oldest_age_s: float = 0.0
    stuck_running: int = 0
    stuck_schedules: int = 0
    materialization_lag_s: float = 0.0
    stuck_outbox_by_tenant: dict[str, int] = field(default_factory=dict)
    queue_depth: dict[str, int] = field(default_factory=dict)


_OUTBOX = """
    SELECT count(*) FILTER (WHERE parked_at IS NULL AND available_at <= %(now)s + interval '60 s'),
           count(*) FILTER (WHERE parked_at IS NULL AND available_at <= %(now)s + interval '300 s'),
           count(*) FILTER (WHERE parked_at IS NULL AND available_at <= %(now)s + interval '900 s'),
           min(available_at) FILTER (WHERE parked_at IS NULL AND available_at <= %(now)s),
           count(*) FILTER (WHERE parked_at IS NULL AND available_at < %(bound)s),
           count(*) FILTER (WHERE parked_at IS NOT NULL),
           count(*) FILTER (WHERE parked_at IS NULL AND available_at > %(now)s)
    FROM occurrences_dispatchoutbox
"""
_OUTBOX_BY_TENANT = """
    SELECT tenant_id, count(*) FROM occurrences_dispatchoutbox
    WHERE parked_at IS NULL AND available_at < %(bound)s
    GROUP BY tenant_id ORDER BY count(*) DESC
"""
# Partition pruning on scheduled_for keeps this to the lookback's day partitions.
_ENQUEUED = """
    SELECT count(*) FILTER (WHERE enqueued_at < %(bound)s), min(enqueued_at)
    FROM occurrences_occurrence
    WHERE state = %(enqueued)s AND scheduled_for >= %(since)s AND scheduled_for <= %(now)s
"""
_RUNNING = """
    SELECT count(*) FROM occurrences_attempt
    WHERE finished_at IS NULL AND lease_expires_at < %(grace)s
"""
# One probe of schedule_due_idx per shard: the earliest next_run_at and the late count. The
# state is spelled into the text, not passed as a parameter: the index is partial on
# `state = 'ACTIVE'`, and a generic plan with `state = $1` could not use it.
_SCHEDULES = f"""
    SELECT min(first.next_run_at), coalesce(sum(late.n), 0)
    FROM generate_series(0, %(shards)s - 1) AS g(shard)
    CROSS JOIN LATERAL (
        SELECT next_run_at FROM schedules_schedule
        WHERE shard = g.shard AND state = '{_ACTIVE}' AND next_run_at IS NOT NULL
        ORDER BY next_run_at LIMIT 1
    ) AS first
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM schedules_schedule
        WHERE shard = g.shard AND state = '{_ACTIVE}' AND next_run_at IS NOT NULL
          AND next_run_at < %(late)s
    ) AS late
"""


def stuck_scan(
    *,
    now: datetime,
    shards: int,
    window_s: int,
    outbox_bound_s: int = 60,
    enqueued_bound_s: int = 300,
    lease_grace_s: int = 10,
    schedule_bound_s: int = 300,
    lookback_s: int = 6 * 3600,
    top_tenants: int = 10,
    broker_url: str | None = None,
    queue_prefix: str = "",
    partitions: int = 0,
) -> ScanResult:
    """One scan (module docstring, steps 1-5); sets the gauges and returns what it saw."""
    started = time.perf_counter()
    result = ScanResult()
    params: dict[str, Any] = {
        "now": now,
        "bound": now - timedelta(seconds=outbox_bound_s),
        "since": now - timedelta(seconds=lookback_s),
        "grace": now - timedelta(seconds=lease_grace_s),
        "late": now - timedelta(seconds=schedule_bound_s),
        "shards": shards,
        "enqueued": str(Occurrence.State.ENQUEUED),
    }
    with connection.cursor() as cursor:
        cursor.execute(_OUTBOX, params)
        row = cursor.fetchone()
        assert row is not None
        d1, d5, d15, oldest, result.stuck_outbox, result.parked, future = row
        result.due = {"1m": d1, "5m": d5, "15m": d15}
        result.outbox_oldest_age_s = (now - oldest).total_seconds() if oldest else 0.0
        cursor.execute(_OUTBOX_BY_TENANT, params)
        result.stuck_outbox_by_tenant = bounded_tenant_counts(cursor.fetchall(), top_tenants)
        cursor.execute(_ENQUEUED, {**params, "bound": now - timedelta(seconds=enqueued_bound_s)})
        row = cursor.fetchone()
        assert row is not None
        result.stuck_enqueued = row[0]
        result.queue_oldest_age_s = (now - row[1]).total_seconds() if row[1] else 0.0
        cursor.execute(_RUNNING, params)
        row = cursor.fetchone()
        result.stuck_running = row[0] if row else 0
        cursor.execute(_SCHEDULES, params)
        row = cursor.fetchone()
        assert row is not None
        earliest, result.stuck_schedules = row[0], int(row[1])
        if earliest is not None:
            trail = (now + timedelta(seconds=window_s) - earliest).total_seconds()
            result.materialization_lag_s = max(trail, 0.0)
    if broker_url:
        result.queue_depth = queue_depths(broker_url, queue_prefix, partitions)
    _publish(result, future)
    metrics.scan_duration_seconds.observe(time.perf_counter() - started)
    return result


def bounded_tenant_counts(rows: Sequence[tuple[object, int]], top: int) -> dict[str, int]:
    """The `top` tenants by count keep their own label; the rest are summed as "other".
    Cardinality stays at most top + 1 however many tenants exist."""
    ranked = sorted(((str(t), int(n)) for t, n in rows), key=lambda r: (-r[1], r[0]))
    out = dict(ranked[:top])
    rest = sum(n for _, n in ranked[top:])
    if rest:
        out["other"] = rest
    return out


def queue_depths(broker_url: str, prefix: str, partitions: int) -> dict[str, int]:
    """Ready messages per lane, by a passive declare of each queue (no message is read)."""
    import amqp

    from apps.occurrences.pipeline.broker import connect_any
    from apps.occurrences.pipeline.queues import LANES, queue_name

    # Any node of a cluster answers for its quorum queues: the first that connects will do.
    conn, _ = connect_any(broker_url, connect_timeout=5)
    depths: dict[str, int] = {}
    try:
        for lane in LANES:
            total = 0
            for k in range(partitions):
                channel = conn.channel()
                try:
                    declared = channel.queue_declare(queue_name(prefix, lane, k), passive=True)
                    assert declared is not None
                    total += declared[1]
                except amqp.exceptions.NotFound:
                    pass  # not declared yet: nothing queued
                finally:
                    if channel.is_open:
                        channel.close()
            depths[lane] = total
    finally:
        conn.close()
    return depths


def _publish(result: ScanResult, future: int) -> None:
    for bucket, count in result.due.items():
        metrics.due_backlog.labels(bucket=bucket).set(count)
    metrics.outbox_oldest_age_seconds.set(result.outbox_oldest_age_s)
    metrics.outbox_rows.labels(status="due").set(result.due.get("1m", 0))
    metrics.outbox_rows.labels(status="future").set(future)
    metrics.outbox_rows.labels(status="parked").set(result.parked)
    metrics.stuck.labels(kind="outbox").set(result.stuck_outbox)
    metrics.stuck.labels(kind="enqueued").set(result.stuck_enqueued)
    metrics.stuck.labels(kind="running").set(result.stuck_running)
    metrics.stuck.labels(kind="schedules").set(result.stuck_schedules)
    metrics.queue_oldest_age_seconds.set(result.queue_oldest_age_s)
    metrics.materialization_lag_seconds.set(result.materialization_lag_s)
    metrics.stuck_outbox_by_tenant.clear()
    for tenant, count in result.stuck_outbox_by_tenant.items():
        metrics.stuck_outbox_by_tenant.labels(tenant=tenant).set(count)
    for lane, depth in result.queue_depth.items():
        metrics.queue_depth.labels(lane=lane).set(depth)
