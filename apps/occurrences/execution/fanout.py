"""Envelope fan-out: the occurrences of an envelope start as soon as any worker slot is free.

The relay packs the occurrences of one tenant and lane due at one instant into envelopes
(pipeline/relay.py): one publish carries up to `envelope_max` of them. Run in the one slot
that received it, an envelope would serialize its items while other slots sit idle (with 1 s
handlers the 50th started ~49 s late). So the worker that receives an envelope republishes
every item but the first as the relay's own one-occurrence message (`occurrence_message`) to
the queue the envelope came from, waits for the broker's confirms, and only then runs the
first item itself (docs/decisions.md, "Envelope fan-out").

Delivery: the envelope is acknowledged only after that run (acks_late). Unconfirmed items
are published again with backoff, as the worker rides out any broker outage; when some are
still unconfirmed after `TICK_WORKER_OUTAGE_RETRY_S`, `FanOutFailed` is raised and the task
hands the envelope back to the broker, never acknowledging it. Every item is therefore in a
confirmed message or still in the unacknowledged envelope. An item delivered twice (an
envelope redelivered after a partial fan-out) is dropped at claim, like any duplicate.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import kombu.exceptions
from django.conf import settings

from apps.occurrences.pipeline.broker import Publisher, occurrence_message
from apps.occurrences.pipeline.outages import call_through_outages
from apps.occurrences.pipeline.queues import all_queue_names, queue_name, tenant_partition

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT_S = 10.0


class FanOutFailed(kombu.exceptions.OperationalError):
    """Some items of an envelope were not confirmed by the broker, so the envelope must not
    be acknowledged. A broker outage as far as the worker can tell: retried as one
    (pipeline/outages.py), then the envelope is handed back."""


def envelope_queue(delivery_info: Mapping[str, Any] | None, item: Mapping[str, Any]) -> str:
    """The queue an envelope came from: its routing key (routing key = queue name on the
    direct exchange, pipeline/queues.py); for an envelope that arrived otherwise, the queue
    of its tenant and lane, as the relay routes it."""
    prefix, partitions = settings.TICK_QUEUE_PREFIX, settings.TICK_TENANT_PARTITIONS
    routing_key = (delivery_info or {}).get("routing_key")
    if routing_key in all_queue_names(prefix, partitions):
        return str(routing_key)
    partition = tenant_partition(uuid.UUID(str(item["tenant_id"])), partitions)
    return queue_name(prefix, str(item["lane"]), partition)


def envelope_fan_out(
    items: Sequence[Any], *, queue: str, publisher: Publisher, give_up_after_s: float | None = None
) -> int:
    """Publish each item as a one-occurrence message to `queue` and wait for the confirms;
    returns how many were published. Unconfirmed items are published again with backoff
    (only those) for up to `give_up_after_s` (default `TICK_WORKER_OUTAGE_RETRY_S`), then
    `FanOutFailed` is raised."""
    pending = {
        index: occurrence_message((index,), queue, item)
        for index, item in enumerate(items)
        if _runnable(item)
    }
    published = len(pending)

    def publish_pending() -> None:
        try:
            result = publisher.publish(list(pending.values()), timeout_s=PUBLISH_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - all count as unconfirmed; a duplicate dies at claim
            raise FanOutFailed(f"{len(pending)} of {published} items: {exc!r}") from exc
        for index in result.confirmed:
            pending.pop(index, None)
        if pending:
            reason = next(iter(result.failed.values()), "unconfirmed")
            raise FanOutFailed(f"{len(pending)} of {published} items not confirmed ({reason})")

    if pending:
        call_through_outages(
            publish_pending,
            who=f"envelope fan-out to {queue}",
            role="worker",
            give_up_after_s=(
                settings.TICK_WORKER_OUTAGE_RETRY_S if give_up_after_s is None else give_up_after_s
            ),
        )
    return published


def _runnable(item: Any) -> bool:
    """An item the relay could have built; another one could not run as its own message
    either, and must not make the envelope's healthy items wait for redeliveries."""
    if isinstance(item, dict) and item.get("occurrence_id"):
        return True
    log.error("envelope item %r dropped: not an occurrence", item)
    return False


_local = threading.local()


def worker_publisher(celery_app: Any) -> Publisher:
    """This worker process's (and thread's) confirming publisher, connected on first use.

    A publisher is neither fork- nor thread-safe: each pool process and thread has its own,
    and one created before a fork is never reused in the child."""
    pid = os.getpid()
    publisher: Publisher | None = getattr(_local, "publisher", None)
    if publisher is None or getattr(_local, "pid", None) != pid:
        publisher = Publisher(
            settings.CELERY_BROKER_URL,
            prefix=settings.TICK_QUEUE_PREFIX,
            partitions=settings.TICK_TENANT_PARTITIONS,
            celery_app=celery_app,
        )
        publisher.origin = f"worker@{socket.gethostname()}:{pid}"
        _local.publisher, _local.pid = publisher, pid
    return publisher
