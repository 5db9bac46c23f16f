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


@dataclass(frozen=True)
class OutboxTarget:
    """What an outbox row needs to know about an occurrence."""

    occurrence_id: uuid.UUID
    scheduled_for: datetime
    schedule_id: uuid.UUID
    schedule_version: int
    tenant_id: uuid.UUID
    shard: int


def requeue_through_outbox(
    cursor: CursorWrapper, occ: OutboxTarget, *, available_at: datetime, now: datetime
) -> None:
    cursor.execute(
        """
        INSERT INTO occurrences_dispatchoutbox
            (occurrence_id, scheduled_for, schedule_id, schedule_version, tenant_id, shard,
             lane, available_at, created_at)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
        """,
        [occ.occurrence_id, occ.scheduled_for, occ.schedule_id, occ.schedule_version,
         occ.tenant_id, occ.shard, Lane.RETRY, available_at, now],
    )  # fmt: skip


# The set-based form (reaper.py, replay.py), as the body of a CTE: one retry-lane outbox row,
# due `%(now)s`, for each row of the statement's CTE `requeued` (id, scheduled_for,
# schedule_id, schedule_version, tenant_id). The caller may append a WHERE on `r`.
REQUEUED_TO_OUTBOX = """
    INSERT INTO occurrences_dispatchoutbox
        (occurrence_id, scheduled_for, schedule_id, schedule_version, tenant_id, shard,
         lane, available_at, created_at)
    SELECT r.id, r.scheduled_for, r.schedule_id, r.schedule_version, r.tenant_id, s.shard,
           %(retry_lane)s, %(now)s, %(now)s
    FROM requeued r JOIN schedules_schedule s ON s.id = r.schedule_id
"""
