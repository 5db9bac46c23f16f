"""The benchmarks' independent consumer: its own AMQP connection, acknowledging everything it
receives and handing each occurrence id it carries (envelopes unpacked) to `received`."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from apps.occurrences.pipeline.broker import connect_any

PREFETCH = 5000
# Acks settle in batches (`multiple`): on a quorum queue every ack is a log entry of its own,
# and one per message made the consumer, not the queue, the bottleneck of a 500k burst.
ACK_EVERY = 200


class OccurrenceConsumer(threading.Thread):
    def __init__(self, broker_url: str, queues: list[str]) -> None:
        super().__init__(name="bench-consumer", daemon=True)
        self.broker_url = broker_url
        self.queues = queues
        self.stop_event = threading.Event()
        self.ready = threading.Event()

    def received(self, occurrence_id: str, arrived: float) -> None:
        """One occurrence arrived (`arrived`: epoch seconds); subclasses record it."""
        raise NotImplementedError

    def run(self) -> None:
        conn, _ = connect_any(self.broker_url)
        channel = conn.channel()
        channel.basic_qos(0, PREFETCH, False)
        unacked: list[int] = []

        def ack_received() -> None:
            if unacked:
                channel.basic_ack(unacked[-1], multiple=True)
                unacked.clear()

        def on_message(message: Any) -> None:
            arrived = time.time()
            _args, kwargs, _embed = json.loads(message.body)
            for item in kwargs.get("occurrences") or [kwargs]:
                self.received(item["occurrence_id"], arrived)
            unacked.append(message.delivery_tag)
            if len(unacked) >= ACK_EVERY:
                ack_received()

        for queue in self.queues:
            channel.basic_consume(queue, callback=on_message)
        self.ready.set()
        while not self.stop_event.is_set():
            try:
                conn.drain_events(timeout=0.2)
            except TimeoutError:
                ack_received()
        ack_received()
        conn.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        self.stop_event.set()
        if self.is_alive():
            self.join(timeout_s)
