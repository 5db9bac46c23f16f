"""Send occurrences back through the outbox's retry lane, inside the caller's transaction.

Every delay of the execution path (quota, overlap re-check, retry backoff, waking a WAITING
occurrence) is an outbox row, never a broker countdown: it commits or rolls back with the state
change that asked for it, and the relay publishes it when `available_at` comes. The caller
already holds the locks of its step (locks.py); this insert takes none of its own.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from django.db.backends.utils import CursorWrapper

from apps.occurrences.models import Lane
from apps.occurrences.pipeline.outbox import outbox_insert


@dataclass(frozen=True)
class OutboxTarget:
    """What an outbox row needs to know about an occurrence."""

    occurrence_id: uuid.UUID
    scheduled_for: datetime
    schedule_id: uuid.UUID
    schedule_version: int
    tenant_id: uuid.UUID
    shard: int


_REQUEUE_ONE = outbox_insert(
    occurrence_id="%(occurrence)s", scheduled_for="%(scheduled_for)s", schedule_id="%(schedule)s",
    schedule_version="%(version)s", tenant_id="%(tenant)s", shard="%(shard)s", lane="%(lane)s",
    available_at="%(available_at)s",
)  # fmt: skip


def requeue_through_outbox(
    cursor: CursorWrapper, occ: OutboxTarget, *, available_at: datetime, now: datetime
) -> None:
    cursor.execute(_REQUEUE_ONE, {
        "occurrence": occ.occurrence_id, "scheduled_for": occ.scheduled_for,
        "schedule": occ.schedule_id, "version": occ.schedule_version, "tenant": occ.tenant_id,
        "shard": occ.shard, "lane": Lane.RETRY, "available_at": available_at, "now": now,
    })  # fmt: skip


# The set-based form (reaper.py, replay.py), as the body of a CTE: one retry-lane outbox row,
# due `%(now)s`, for each row of the statement's CTE `requeued` (id, scheduled_for,
# schedule_id, schedule_version, tenant_id). The caller may append a WHERE on `r`.
REQUEUED_TO_OUTBOX = outbox_insert(
    occurrence_id="r.id", scheduled_for="r.scheduled_for", schedule_id="r.schedule_id",
    schedule_version="r.schedule_version", tenant_id="r.tenant_id", shard="s.shard",
    lane="%(retry_lane)s", available_at="%(now)s",
    source="FROM requeued r JOIN schedules_schedule s ON s.id = r.schedule_id",
)  # fmt: skip
