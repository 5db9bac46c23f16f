"""Grouping recorded alerts into messages, and publishing those messages to the workers.

Run by the reaper every pass (`manage.py reap`). Per channel, pending alerts wait
`coalesce_s` for company and a channel gets at most one message per `interval_s`: a burst of
10,000 DEAD occurrences is one digest, not 10,000 e-mails. A message (`AlertDelivery`) is
created in the same transaction that assigns its alerts, then published to the alerts queue
with a broker confirm; until confirmed its `published_at` stays NULL and the next pass
publishes it again (at least once; the worker skips a message already sent).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection, transaction

from apps.occurrences.models import Alert, AlertChannel, AlertDelivery
from apps.occurrences.pipeline.broker import OutgoingMessage, Publisher
from apps.occurrences.pipeline.queues import ALERT_TASK_NAME, alerts_queue_name

log = logging.getLogger(__name__)

_PENDING_BY_CHANNEL = """
    SELECT a.channel_id, min(a.fired_at)
    FROM occurrences_alert a
    JOIN occurrences_alertchannel c ON c.id = a.channel_id AND c.confirmed_at IS NOT NULL
    WHERE a.delivery_id IS NULL
    GROUP BY a.channel_id
    LIMIT %(limit)s
"""


@dataclass(frozen=True)
class DispatchResult:
    deliveries: int  # messages created this pass
    alerts: int  # alerts they carry
    published: int  # messages confirmed by the broker this pass


def _ready(
    *, first_fired: datetime, last_sent: datetime | None, now: datetime, coalesce_s: int,
    interval_s: int,
) -> bool:  # fmt: skip
    """After the coalescing wait and the channel's interval; test alerts too, so that a test
    button pressed in a loop still makes one message per channel per interval."""
    if first_fired > now - timedelta(seconds=coalesce_s):
        return False
    return last_sent is None or last_sent <= now - timedelta(seconds=interval_s)


def group_pending(
    *, now: datetime, coalesce_s: int, interval_s: int, limit: int = 500
) -> tuple[int, int]:
    """Turn each ready channel's pending alerts into one message; returns (messages, alerts)."""
    with connection.cursor() as cursor:
        cursor.execute(_PENDING_BY_CHANNEL, {"limit": limit})
        pending = cursor.fetchall()
    deliveries = alerts = 0
    for channel_id, first_fired in pending:
        with transaction.atomic():
            channel = (
                AlertChannel.objects.select_for_update(skip_locked=True)
                .filter(id=channel_id)
                .first()
            )
            if channel is None or not _ready(
                first_fired=first_fired, last_sent=channel.last_sent_at, now=now,
                coalesce_s=coalesce_s, interval_s=interval_s,
            ):  # fmt: skip
                continue
            delivery = AlertDelivery.objects.create(
                id=uuid.uuid4(), tenant_id=channel.tenant_id, channel=channel, alert_count=0,
                created_at=now, available_at=now,
            )  # fmt: skip
            count = Alert.objects.filter(channel=channel, delivery__isnull=True).update(
                delivery=delivery
            )
            if not count:
                delivery.delete()
                continue
            delivery.alert_count = count
            delivery.save(update_fields=["alert_count"])
            channel.last_sent_at = now
            channel.save(update_fields=["last_sent_at"])
        deliveries += 1
        alerts += count
    return deliveries, alerts


def publish_pending(*, now: datetime, publisher: Publisher, limit: int = 500) -> int:
    """Publish the messages not yet confirmed (new ones, and ones a failed send backs off)."""
    rows = list(
        AlertDelivery.objects.filter(
            published_at__isnull=True, state=AlertDelivery.State.PENDING, available_at__lte=now
        )
        .order_by("available_at")
        .values_list("id", "available_at")[:limit]
    )
    if not rows:
        return 0
    queue = alerts_queue_name(publisher.prefix)
    messages = [
        OutgoingMessage((i,), queue, ALERT_TASK_NAME, str(d), {"delivery_id": str(d)})
        for i, (d, _) in enumerate(rows)
    ]
    result = publisher.publish(messages)
    published = 0
    for key, confirmed_at in result.confirmed.items():
        delivery_id, available_at = rows[key]
        # Not over a concurrent send's back-off or a worker's "tenant busy" hand-back (either
        # moved `available_at` and cleared the stamp): that message needs publishing again.
        # A worker that has only begun the send changes `attempts`, not `available_at`: the
        # message is published, and counting it unpublished would send a second copy at once.
        published += AlertDelivery.objects.filter(
            id=delivery_id, published_at__isnull=True, available_at=available_at
        ).update(published_at=confirmed_at)
    for key, reason in result.failed.items():
        log.warning("alert message %s not confirmed: %s", rows[key][0], reason)
    return published


def alerts_dispatch(
    *, now: datetime, publisher: Publisher, coalesce_s: int, interval_s: int
) -> DispatchResult:
    deliveries, alerts = group_pending(now=now, coalesce_s=coalesce_s, interval_s=interval_s)
    published = publish_pending(now=now, publisher=publisher)
    return DispatchResult(deliveries, alerts, published)
