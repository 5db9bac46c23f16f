"""Pipelined, confirmed publishing to RabbitMQ as Celery task messages (SPEC §6).

Celery's own `apply_async` waits for each confirm (under 1k messages/s, ../shared/FACTS.md);
the relay needs the broker to confirm many messages in flight. This publisher speaks AMQP
through py-amqp (Celery's own transport library) on a channel in confirm mode, publishes a
window of messages with `mandatory`, then drains acks/nacks/returns. The message body and
headers are built by Celery (`app.amqp.as_task_v2`), so workers see ordinary tasks.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, urlparse

import amqp
from kombu.serialization import dumps

from apps.occurrences.queues import (
    LANES,
    QUEUE_ARGUMENTS,
    all_queue_names,
    exchange_name,
    queue_name,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OutgoingMessage:
    keys: tuple[int, ...]  # the caller's ids for what the message carries (outbox row ids)
    queue: str
    task_name: str
    task_id: str
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class PublishResult:
    confirmed: dict[int, datetime]  # key -> confirm time (UTC)
    failed: dict[int, str]  # key -> reason (nack, unroutable, timeout)


class Publisher:
    def __init__(self, broker_url: str, *, prefix: str, partitions: int, celery_app: Any) -> None:
        self.broker_url = broker_url
        self.prefix = prefix
        self.partitions = partitions
        self.celery_app = celery_app
        self.origin = f"relay@{socket.gethostname()}"
        self._conn: amqp.Connection | None = None
        self._channel: Any = None
        # Confirm bookkeeping for the publish in progress: outcome per delivery tag, and the
        # highest tag settled by a `multiple` ack/nack, so each tag is settled once (O(n)).
        self._outcome: dict[int, tuple[bool, datetime]] = {}
        self._settled_floor = 0
        self._returned: set[str] = set()
        self._next_tag = 1

    # -- connection and topology -----------------------------------------------------------
    def connect(self) -> None:
        url = urlparse(self.broker_url)
        vhost = unquote(url.path[1:]) if len(url.path) > 1 else "/"
        conn = amqp.Connection(
            host=f"{url.hostname or '127.0.0.1'}:{url.port or 5672}",
            userid=unquote(url.username or "guest"),
            password=unquote(url.password or "guest"),
            virtual_host=vhost,
            connect_timeout=10,
            heartbeat=0,
        )
        conn.connect()
        channel: Any = conn.channel()
        channel.confirm_select()
        channel.events["basic_ack"].add(self._on_ack)
        channel.events["basic_nack"].add(self._on_nack)
        channel.events["basic_return"].add(self._on_return)
        self._conn, self._channel, self._next_tag = conn, channel, 1
        self.declare_topology()

    def declare_topology(self) -> None:
        """Declare the exchange and every lane queue (idempotent) before any publish."""
        channel = self._channel
        exchange = exchange_name(self.prefix)
        channel.exchange_declare(exchange, "direct", durable=True, auto_delete=False)
        for lane in LANES:
            for partition in range(self.partitions):
                name = queue_name(self.prefix, lane, partition)
                channel.queue_declare(
                    name, durable=True, auto_delete=False, arguments=dict(QUEUE_ARGUMENTS)
                )
                channel.queue_bind(name, exchange, routing_key=name)

    def delete_topology(self) -> None:
        """Delete this prefix's queues and exchange (benchmarks' and tests' private ones)."""
        if self._conn is None:
            self.connect()
        for name in all_queue_names(self.prefix, self.partitions):
            self._channel.queue_delete(name)
        self._channel.exchange_delete(exchange_name(self.prefix))

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                log.debug("error closing broker connection", exc_info=True)
        self._conn = self._channel = None

    # -- confirm callbacks -----------------------------------------------------------------
    def _settle(self, tag: int, multiple: bool, ok: bool) -> None:
        settled = (ok, datetime.now(UTC))  # enqueued_at: when the broker confirmed
        if multiple:
            for pending in range(self._settled_floor + 1, tag + 1):
                self._outcome.setdefault(pending, settled)
            self._settled_floor = max(self._settled_floor, tag)
        else:
            self._outcome.setdefault(tag, settled)

    def _on_ack(self, tag: int, multiple: bool) -> None:
        self._settle(tag, multiple, True)

    def _on_nack(self, tag: int, multiple: bool) -> None:
        self._settle(tag, multiple, False)

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        task_id = message.properties.get("correlation_id")
        if task_id:
            self._returned.add(str(task_id))

    # -- publishing ------------------------------------------------------------------------
    def _message(self, out: OutgoingMessage) -> amqp.Message:
        # argsrepr/kwargsrepr given: Celery would otherwise saferepr() every message.
        task = self.celery_app.amqp.as_task_v2(
            out.task_id,
            out.task_name,
            args=(),
            kwargs=out.kwargs,
            origin=self.origin,
            argsrepr="()",
            kwargsrepr=f"{{'occurrences': {len(out.keys)}}}",
        )
        content_type, content_encoding, body = dumps(task.body, serializer="json")
        headers = dict(task.headers)
        headers["ignore_result"] = True
        return amqp.Message(
            body=body,
            content_type=content_type,
            content_encoding=content_encoding,
            application_headers=headers,
            delivery_mode=2,
            correlation_id=out.task_id,
            priority=0,
        )

    def prepare(self, messages: Sequence[OutgoingMessage]) -> list[tuple[OutgoingMessage, Any]]:
        """Serialise messages ahead of their instant, so publishing then is only I/O."""
        return [(out, self._message(out)) for out in messages]

    def publish(
        self, messages: Sequence[OutgoingMessage], *, timeout_s: float = 10.0
    ) -> PublishResult:
        """Publish all `messages` with confirms in flight; wait for every confirm.

        A message counts as enqueued only if the broker acked it and did not return it as
        unroutable. Anything else is reported failed (for every key it carries) and stays in
        the outbox.
        """
        if self._conn is None:
            self.connect()
        try:
            return self._publish(self.prepare(messages), timeout_s)
        except Exception:
            # The connection's state is unknown: drop it; the caller's rows stay unrecorded.
            self.close()
            raise

    def publish_prepared(
        self, prepared: list[tuple[OutgoingMessage, Any]], *, timeout_s: float = 10.0
    ) -> PublishResult:
        """`publish` for messages from `prepare`."""
        if self._conn is None:
            self.connect()
        try:
            return self._publish(prepared, timeout_s)
        except Exception:
            self.close()
            raise

    def _publish(
        self, prepared: list[tuple[OutgoingMessage, Any]], timeout_s: float
    ) -> PublishResult:
        messages = [out for out, _ in prepared]
        channel = self._channel
        exchange = exchange_name(self.prefix)
        first_tag = self._next_tag
        self._outcome = {}
        self._settled_floor = first_tag - 1
        self._returned = set()
        for out, message in prepared:
            channel.basic_publish(message, exchange=exchange, routing_key=out.queue, mandatory=True)
        self._next_tag = first_tag + len(messages)
        deadline = time.monotonic() + timeout_s
        while len(self._outcome) < len(messages):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                self._conn.drain_events(timeout=min(remaining, 1.0))  # type: ignore[union-attr]
            except TimeoutError:
                pass
        confirmed: dict[int, datetime] = {}
        failed: dict[int, str] = {}
        for offset, out in enumerate(messages):
            outcome = self._outcome.get(first_tag + offset)
            if outcome is None:
                reason = "no confirm before timeout"
            elif not outcome[0]:
                reason = "nacked by broker"
            elif out.task_id in self._returned:
                reason = "unroutable (returned)"
            else:
                for key in out.keys:
                    confirmed[key] = outcome[1]
                continue
            for key in out.keys:
                failed[key] = reason
        if len(self._outcome) < len(messages):
            # Unconfirmed messages may still arrive later: the channel's state is unknown,
            # so start afresh; the rows stay in the outbox and are republished (same ids).
            self.close()
        return PublishResult(confirmed, failed)
