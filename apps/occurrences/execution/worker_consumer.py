"""The Celery worker's consumer, without Celery's native delayed delivery step.

Celery adds a `DelayedDelivery` bootstep whenever a queue is a quorum queue: at every consumer
(re)start, before the consumer processes a single message, it declares delay exchanges and
queues on each URL of the broker URL and retries a node that does not answer (3 times, 1-5 s
apart). With the nodes of a cluster listed (`a;b;c`) and one node down, that held every worker
idle for ~17 s after each failover, and at start. Tick never sends ETA/countdown tasks
(retries and delays go through the outbox), so the step only costs time and topology.
"""

from __future__ import annotations

from typing import Any

from celery.worker.consumer import Consumer

_ConsumerBlueprint: Any = Consumer.Blueprint


class TickConsumer(Consumer):
    class Blueprint(_ConsumerBlueprint):
        default_steps = [
            step
            for step in _ConsumerBlueprint.default_steps
            if not step.endswith(":DelayedDelivery")
        ]
