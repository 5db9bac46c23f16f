"""Dispatch: publish due outbox rows to RabbitMQ, then record them (SPEC §6).

One step (`relay_step`), one transaction:
1. Fence on this process's relay shard leases (FOR SHARE), then claim due outbox rows of
   those shards (`available_at <= now + look-ahead`) with `FOR UPDATE SKIP LOCKED`.
2. Wait until each row's `available_at` (never publish early), interleaving tenants, and
   publish them as Celery task messages with publisher confirms and `mandatory`.
3. For the confirmed rows only: set `enqueued_at` (first confirm) and ENQUEUED, delete their
   outbox rows, commit. Failed publishes stay in the outbox for the next step.
A crash after a confirm and before the commit leaves the rows in the outbox: they are
published again with the same occurrence id (an accepted duplicate, dropped at claim).
Marking rows sent before the broker confirmed them would lose occurrences: never done.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict, deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from apps.occurrences import metrics
from apps.occurrences.broker import OutgoingMessage, Publisher
from apps.occurrences.leases import LeaseSet
from apps.occurrences.queues import queue_name, tenant_partition

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RelayConfig:
    lookahead_ms: int
    batch_size: int
    prefix: str
    partitions: int


@dataclass
class RelayResult:
    claimed: int = 0
    published: int = 0
    failed: int = 0
    lags: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class _OutboxRow:
    id: int
    occurrence_id: uuid.UUID
    scheduled_for: datetime
    schedule_id: uuid.UUID
    schedule_version: int
    tenant_id: uuid.UUID
    lane: str
    available_at: datetime


_CLAIM = """
    SELECT id, occurrence_id, scheduled_for, schedule_id, schedule_version, tenant_id, lane,
           available_at
    FROM occurrences_dispatchoutbox
    WHERE shard = ANY(%s) AND available_at <= %s
    ORDER BY available_at
    LIMIT %s
    FOR UPDATE SKIP LOCKED
"""

_RECORD = """
    WITH done AS (
        SELECT * FROM unnest(%s::bigint[], %s::uuid[], %s::timestamptz[], %s::timestamptz[])
            AS d(outbox_id, occurrence_id, scheduled_for, confirmed_at)
    ),
    occ AS (
        UPDATE occurrences_occurrence o
        SET enqueued_at = COALESCE(o.enqueued_at, d.confirmed_at),
            state = CASE WHEN o.state IN ('SCHEDULED', 'RETRY_WAIT') THEN 'ENQUEUED'
                         ELSE o.state END
        FROM done d
        WHERE o.id = d.occurrence_id AND o.scheduled_for = d.scheduled_for
        RETURNING 1
    )
    DELETE FROM occurrences_dispatchoutbox WHERE id IN (SELECT outbox_id FROM done)
"""


def interleave_tenants(rows: list[_OutboxRow]) -> list[_OutboxRow]:
    """Round-robin across tenants within each `available_at` instant, so one tenant's burst
    does not queue ahead of everyone else who is due at the same moment."""
    by_instant: dict[datetime, dict[uuid.UUID, deque[_OutboxRow]]] = defaultdict(
        lambda: defaultdict(deque)
    )
    for row in rows:
        by_instant[row.available_at][row.tenant_id].append(row)
    ordered: list[_OutboxRow] = []
    for instant in sorted(by_instant):
        queues = list(by_instant[instant].values())
        while queues:
            for q in queues:
                ordered.append(q.popleft())
            queues = [q for q in queues if q]
    return ordered


def _message(row: _OutboxRow, config: RelayConfig) -> OutgoingMessage:
    partition = tenant_partition(row.tenant_id, config.partitions)
    return OutgoingMessage(
        key=row.id,
        queue=queue_name(config.prefix, row.lane, partition),
        task_id=str(row.occurrence_id),
        kwargs={
            "occurrence_id": str(row.occurrence_id),
            "scheduled_for": row.scheduled_for.isoformat(),
            "schedule_id": str(row.schedule_id),
            "schedule_version": row.schedule_version,
            "tenant_id": str(row.tenant_id),
            "lane": row.lane,
        },
    )


def relay_step(*, leases: LeaseSet, publisher: Publisher, config: RelayConfig) -> RelayResult:
    """Claim, publish and record one batch (module docstring, steps 1-3)."""
    result = RelayResult()
    with transaction.atomic(), connection.cursor() as cursor:
        shards = leases.fenced_shards()
        if not shards:
            return result
        until = timezone.now() + timedelta(milliseconds=config.lookahead_ms)
        cursor.execute(_CLAIM, [shards, until, config.batch_size])
        rows = [_OutboxRow(*values) for values in cursor.fetchall()]
        result.claimed = len(rows)
        if not rows:
            return result
        confirmed: dict[int, datetime] = {}
        by_id = {row.id: row for row in rows}
        ordered = interleave_tenants(rows)
        start = 0
        while start < len(ordered):
            # Publish everything already due together; wait for the next instant otherwise.
            due_at = ordered[start].available_at
            wait = (due_at - timezone.now()).total_seconds()
            if wait > 0:
                time.sleep(wait)
            now = timezone.now()
            end = start
            while end < len(ordered) and ordered[end].available_at <= now:
                end += 1
            outcome = publisher.publish([_message(r, config) for r in ordered[start:end]])
            confirmed.update(outcome.confirmed)
            for key, reason in outcome.failed.items():
                log.warning("publish of outbox row %s failed: %s", key, reason)
            result.failed += len(outcome.failed)
            start = end
        if confirmed:
            ids = list(confirmed)
            cursor.execute(_RECORD, [
                ids,
                [by_id[i].occurrence_id for i in ids],
                [by_id[i].scheduled_for for i in ids],
                [confirmed[i] for i in ids],
            ])  # fmt: skip
        result.published = len(confirmed)
    for key, at in confirmed.items():
        row = by_id[key]
        reference = row.scheduled_for if row.lane in ("strict", "catchup") else row.available_at
        lag = (at - reference).total_seconds()
        result.lags.append(lag)
        metrics.schedule_lag_seconds.labels(lane=row.lane).observe(lag)
        metrics.published.labels(lane=row.lane).inc()
    metrics.publish_failures.inc(result.failed)
    return result
