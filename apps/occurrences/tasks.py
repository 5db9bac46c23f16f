"""Celery entry point: the relay publishes `tick.run_occurrence` messages to the lane queues.

Hardening (settings.py): JSON only (a pickled message is refused before deserialization),
`acks_late` + `reject_on_worker_lost`, prefetch multiplier 1; the queues carry a delivery
limit (queues.py). Duplicates and crashes are absorbed by the claim, not by the broker.
"""

from __future__ import annotations

import os
import uuid
from datetime import datetime
from typing import Any

from celery import shared_task

from apps.occurrences.execution import occurrence_execute
from apps.occurrences.queues import ENVELOPE_TASK_NAME, TASK_NAME


@shared_task(
    name=TASK_NAME, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True
)
def run_occurrence(
    self: Any, /, occurrence_id: str, scheduled_for: str, **_: Any
) -> dict[str, Any]:
    # The pid tells operators (and the crash tests) which pool process ran the attempt.
    return occurrence_execute(
        occurrence_id=uuid.UUID(occurrence_id),
        scheduled_for=datetime.fromisoformat(scheduled_for),
        worker_id=f"{self.request.hostname or 'worker'}:{os.getpid()}",
    )


@shared_task(
    name=ENVELOPE_TASK_NAME,
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def run_occurrences(self: Any, /, occurrences: list[dict[str, Any]], **_: Any) -> list[str]:
    """An envelope of occurrences due at one instant (relay bursts): each one is claimed,
    run and completed on its own, so a duplicate or a crash affects each independently."""
    worker_id = f"{self.request.hostname or 'worker'}:{os.getpid()}"
    statuses: list[str] = []
    for item in occurrences:
        summary = occurrence_execute(
            occurrence_id=uuid.UUID(item["occurrence_id"]),
            scheduled_for=datetime.fromisoformat(item["scheduled_for"]),
            worker_id=worker_id,
        )
        statuses.append(str(summary["status"]))
    return statuses
