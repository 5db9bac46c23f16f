"""The worker's task for alert messages (a thin wrapper over deliver.py)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from celery import shared_task

from apps.occurrences.alerts.deliver import alert_deliver
from apps.occurrences.pipeline.queues import ALERT_TASK_NAME


@shared_task(
    name=ALERT_TASK_NAME, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True
)
def deliver_alert(self: Any, /, delivery_id: str, **_: Any) -> str:
    state = alert_deliver(UUID(delivery_id))
    return str(state)
