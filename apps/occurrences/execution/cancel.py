"""Cancel one occurrence on a tenant's request (API, UI).

Lock story of the cancel — it may race a claim, a completion and the reaper; conditional
updates only, each one statement:
- pending (any state a claim accepts) → CANCELED at once. The UPDATE takes the occurrence row
  lock, so it serializes with a claim (claim.py, a): a claim that comes second sees CANCELED
  and drops the delivery as a duplicate; a cancel that comes second finds RUNNING and falls
  through to the cooperative case.
- RUNNING → `cancel_requested_at` is set (first request wins) and the state is left alone:
  the attempt's heartbeat reads it (heartbeat.py) and raises the handler's flag; the
  completion then records CANCELED (complete.py, b).
- anything else is already final: nothing to cancel.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum

from django.db import connection, transaction
from django.utils import timezone

from apps.occurrences.execution.claim import CLAIMABLE
from apps.occurrences.models import Occurrence


class CancelOutcome(StrEnum):
    CANCELED = "canceled"  # was not running: final at once
    REQUESTED = "cancel_requested"  # running: the handler is asked to stop
    FINAL = "final"  # already finished: nothing to cancel
    NOT_FOUND = "not_found"


def occurrence_cancel(
    *, tenant_id: uuid.UUID, occurrence_id: uuid.UUID, now: datetime | None = None
) -> CancelOutcome:
    """Cancel one occurrence: pending → CANCELED now; RUNNING → cooperative (the heartbeat
    raises the handler's flag; the attempt ends CANCELED). Conditional updates only."""
    now = now or timezone.now()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE occurrences_occurrence SET state = %s, finished_at = %s
            WHERE tenant_id = %s AND id = %s AND state = ANY(%s)
            """,
            [Occurrence.State.CANCELED, now, tenant_id, occurrence_id, list(CLAIMABLE)],
        )
        if cursor.rowcount:
            return CancelOutcome.CANCELED
        cursor.execute(
            """
            UPDATE occurrences_occurrence
            SET cancel_requested_at = COALESCE(cancel_requested_at, %s)
            WHERE tenant_id = %s AND id = %s AND state = %s
            """,
            [now, tenant_id, occurrence_id, Occurrence.State.RUNNING],
        )
        if cursor.rowcount:
            return CancelOutcome.REQUESTED
        cursor.execute(
            "SELECT 1 FROM occurrences_occurrence WHERE tenant_id = %s AND id = %s",
            [tenant_id, occurrence_id],
        )
        return CancelOutcome.FINAL if cursor.fetchone() else CancelOutcome.NOT_FOUND
