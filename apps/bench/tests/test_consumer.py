"""The benchmarks' consumer: every occurrence of envelopes and single messages, all acked."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

from django.conf import settings

from apps.bench.consumer import OccurrenceConsumer
from apps.occurrences.pipeline.queues import all_queue_names
from apps.occurrences.pipeline.relay import OutboxRow, build_messages
from apps.occurrences.tests.support.pipeline import relay_config


class _Recording(OccurrenceConsumer):
    def __init__(self, broker_url: str, queues: list[str]) -> None:
        super().__init__(broker_url, queues)
        self.ids: list[str] = []

    def received(self, occurrence_id: str, arrived: float) -> None:
        self.ids.append(occurrence_id)


def test_it_receives_every_occurrence_and_leaves_nothing_unacknowledged(queue_prefix, publisher):
    at = datetime(2026, 12, 3, tzinfo=UTC)
    big, lone = str(uuid.uuid4()), str(uuid.uuid4())
    rows = [
        OutboxRow(i, str(uuid.uuid4()), at, str(uuid.uuid4()), 1, tenant, "strict", at, 0)
        for i, tenant in enumerate([big] * 7 + [lone])
    ]
    [messages] = build_messages(rows, relay_config(queue_prefix))  # one envelope, one single
    assert publisher.publish(messages).failed == {}
    queues = all_queue_names(queue_prefix, settings.TICK_TENANT_PARTITIONS)
    consumer = _Recording(settings.CELERY_BROKER_URL, queues)

    consumer.start()
    deadline = time.monotonic() + 10
    while len(consumer.ids) < len(rows) and time.monotonic() < deadline:
        time.sleep(0.05)
    consumer.stop()

    assert sorted(consumer.ids) == sorted(row.occurrence_id for row in rows)
    # Acked (in a batch at the idle drain): nothing left for another consumer.
    assert all(publisher._channel.queue_declare(q, passive=True).message_count == 0 for q in queues)
