"""Celery entry point: the relay publishes `tick.run_occurrence` messages to the lane queues."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from celery import shared_task

from apps.occurrences.execution import occurrence_execute
from apps.occurrences.queues import TASK_NAME


@shared_task(name=TASK_NAME, bind=True, acks_late=True, ignore_result=True)
def run_occurrence(
    self: Any, /, occurrence_id: str, scheduled_for: str, **_: Any
) -> dict[str, Any]:
    return occurrence_execute(
        occurrence_id=uuid.UUID(occurrence_id),
        scheduled_for=datetime.fromisoformat(scheduled_for),
        worker_id=str(self.request.hostname or "worker"),
    )
