"""Replay DEAD occurrences from the dead-letter view: step 5 of the execution path.

Lock story of the replay — it may race another replay of the same ids (two operators, a
double click); one statement in one transaction: a conditional `UPDATE … WHERE state = DEAD` and the
outbox rows of exactly the rows it changed. The row lock of that UPDATE decides a race: the
second replay finds the occurrence no longer DEAD and reports it `not_dead`, so one replay
yields one outbox row. The occurrence keeps its id and goes back to RETRY_WAIT with a fresh
attempt budget (`attempt_base`) and deadline; from there it is claimed like any retry
(claim.py). A replay is a person's decision and does not spend the tenant's hourly retry
budget (retry_bounds.py); the retries after it do.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.occurrences.execution.requeue import REQUEUED_TO_OUTBOX
from apps.occurrences.models import Lane, Occurrence
from apps.occurrences.observability import metrics


@dataclass
class ReplayResult:
    replayed: list[uuid.UUID] = field(default_factory=list)
    not_dead: dict[uuid.UUID, str] = field(default_factory=dict)  # id -> current state
    not_found: list[uuid.UUID] = field(default_factory=list)


_REPLAY = (
    """
    WITH requeued AS (
        UPDATE occurrences_occurrence o
        SET state = %(retry_wait)s, finished_at = NULL, attempt_base = o.attempt_count,
            deadline_at = %(deadline)s, cancel_requested_at = NULL
        WHERE o.tenant_id = %(tenant)s AND o.id = ANY(%(ids)s) AND o.state = %(dead)s
        RETURNING o.id, o.scheduled_for, o.schedule_id, o.schedule_version, o.tenant_id
    ),
    outbox AS ("""
    + REQUEUED_TO_OUTBOX
    + """
        RETURNING 1
    )
    SELECT id FROM requeued
"""
)


def occurrences_replay(
    *, tenant_id: uuid.UUID, occurrence_ids: Sequence[uuid.UUID], now: datetime | None = None
) -> ReplayResult:
    """Replay DEAD occurrences of one tenant: same id, back to RETRY_WAIT with a retry-lane
    outbox row due now, a fresh attempt budget and deadline. Ids of other tenants are
    reported not found and left untouched."""
    now = now or timezone.now()
    ids = list(dict.fromkeys(occurrence_ids))
    result = ReplayResult()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            _REPLAY,
            {
                "tenant": tenant_id,
                "ids": ids,
                "now": now,
                "deadline": now + timedelta(seconds=settings.TICK_RETRY_DEADLINE_S),
                "retry_wait": Occurrence.State.RETRY_WAIT,
                "dead": Occurrence.State.DEAD,
                "retry_lane": Lane.RETRY,
            },
        )
        replayed = {r[0] for r in cursor.fetchall()}
        rest = [i for i in ids if i not in replayed]
        if rest:
            cursor.execute(
                "SELECT id, state FROM occurrences_occurrence "
                "WHERE tenant_id = %s AND id = ANY(%s)",
                [tenant_id, rest],
            )
            result.not_dead = {r[0]: r[1] for r in cursor.fetchall()}
    result.replayed = [i for i in ids if i in replayed]
    result.not_found = [i for i in rest if i not in result.not_dead]
    metrics.replays.inc(len(result.replayed))
    return result
