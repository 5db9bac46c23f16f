"""RabbitMQ topology: lanes x tenant partitions, as durable quorum queues.

Imports no models module: Celery builds its queue list from it before Django's apps are loaded
(tickweb/celery.py), and the relay declares the same topology before publishing. The lanes
therefore come from apps/occurrences/lanes.py, which holds only the enum.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Final

from kombu import Exchange, Queue

from apps.occurrences.lanes import Lane

LANES: Final = tuple(lane.value for lane in Lane)
# x-delivery-limit: a message redelivered this often (e.g. it crashes every worker) is
# dropped by RabbitMQ instead of looping; the outbox/reaper still owns the occurrence.
# Queues declared earlier with other arguments fail with PRECONDITION_FAILED: delete them.
QUEUE_ARGUMENTS: Final = {"x-queue-type": "quorum", "x-delivery-limit": 10}
TASK_NAME: Final = "tick.run_occurrence"
# One message carrying several occurrences due at the same instant for the same tenant and
# lane (bursts); each occurrence is still claimed, run and completed on its own.
ENVELOPE_TASK_NAME: Final = "tick.run_occurrences"
# Alert deliveries (apps/occurrences/alerts/): one queue per prefix, apart from the lanes so
# that a burst of occurrences never delays an alert about them, nor the reverse.
ALERT_TASK_NAME: Final = "tick.deliver_alert"


def exchange_name(prefix: str) -> str:
    return prefix


def tenant_partition(tenant_id: uuid.UUID, partitions: int) -> int:
    """Stable H(tenant) mod P: the same in every process (never Python's salted hash())."""
    digest = hashlib.blake2b(tenant_id.bytes, digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def queue_name(prefix: str, lane: str, partition: int) -> str:
    return f"{prefix}.{lane}.p{partition}"


def alerts_queue_name(prefix: str) -> str:
    return f"{prefix}.alerts"


def all_queue_names(prefix: str, partitions: int) -> list[str]:
    """Every queue of the topology: lane x partition, then the alerts queue."""
    lanes = [queue_name(prefix, lane, p) for lane in LANES for p in range(partitions)]
    return [*lanes, alerts_queue_name(prefix)]


def celery_queues(prefix: str, partitions: int) -> list[Queue]:
    """Queues for Celery workers; routing key = queue name on one direct exchange."""
    exchange = Exchange(exchange_name(prefix), type="direct", durable=True)
    return [
        Queue(name, exchange, routing_key=name, durable=True, queue_arguments=QUEUE_ARGUMENTS)
        for name in all_queue_names(prefix, partitions)
    ]
