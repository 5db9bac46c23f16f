"""Pipelined, confirmed publishing to RabbitMQ as Celery task messages.

Celery's own `apply_async` waits for each confirm (under 1k messages/s measured here); the
relay needs the broker to confirm many messages in flight. This publisher speaks AMQP
through py-amqp (Celery's own transport library) on a channel in confirm mode, publishes a
window of messages with `mandatory`, then drains acks/nacks/returns. The message body and
headers are built by Celery (`app.amqp.as_task_v2`), so workers see ordinary tasks.

The broker URL may list the nodes of a cluster separated by `;` (Celery/kombu's failover
syntax); the publisher then connects to the first node that answers (docs/operations.md,
"RabbitMQ in production").
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

from apps.occurrences.pipeline.queues import (
    QUEUE_ARGUMENTS,
    TASK_NAME,
    all_queue_names,
    exchange_name,
)

log = logging.getLogger(__name__)

# Per node: a single broker keeps the old generous bound; with a node list a silent node
# (a partition drops packets rather than refusing) must not stall the failover for long.
CONNECT_TIMEOUT_S = 10.0
FAILOVER_CONNECT_TIMEOUT_S = 5.0


def broker_urls(broker_url: str) -> list[str]:
    """The node URLs of a broker URL: one, or several separated by `;` (kombu's syntax)."""
    urls = [part.strip() for part in broker_url.split(";") if part.strip()]
    if not urls:
        raise ValueError("the broker URL names no node")
    return urls


def node_address(url: str) -> str:
    """host:port of one node URL, for logs (never the credentials)."""
    parsed = urlparse(url)
    return f"{parsed.hostname or '127.0.0.1'}:{parsed.port or 5672}"


def amqp_connection(url: str, **options: Any) -> amqp.Connection:
    """An unconnected py-amqp connection to the node of one AMQP URL."""
    parsed = urlparse(url)
    vhost = unquote(parsed.path[1:]) if len(parsed.path) > 1 else "/"
    return amqp.Connection(
        host=node_address(url),
        userid=unquote(parsed.username or "guest"),
        password=unquote(parsed.password or "guest"),
        virtual_host=vhost,
        **options,
    )


def connect_any(broker_url: str, *, start: int = 0, **options: Any) -> tuple[amqp.Connection, int]:
    """Connect to the first node that answers, trying them in turn from index `start`.

    Returns the connection and the index of its node; raises the last node's error when
    none answers (an `OSError` or AMQP connection error, which callers treat as an outage).
    """
    urls = broker_urls(broker_url)
    options.setdefault(
        "connect_timeout", CONNECT_TIMEOUT_S if len(urls) == 1 else FAILOVER_CONNECT_TIMEOUT_S
    )
    error: Exception | None = None
    for step in range(len(urls)):
        index = (start + step) % len(urls)
        conn = amqp_connection(urls[index], **options)
        try:
            conn.connect()
        except Exception as exc:  # noqa: BLE001 - any node failure: try the next node
            _discard(conn)
            if len(urls) > 1:
                log.warning(
                    "broker node %s: %s", node_address(urls[index]), str(exc) or type(exc).__name__
                )
            error = exc
            continue
        return conn, index
    assert error is not None
    raise error


def _discard(conn: amqp.Connection) -> None:
    try:
        conn.collect()
    except Exception:  # noqa: BLE001 - releasing a connection that never worked
        log.debug("error releasing a failed broker connection", exc_info=True)


@dataclass(frozen=True)
class OutgoingMessage:
    keys: tuple[int, ...]  # the caller's ids for what the message carries (outbox row ids)
    queue: str
    task_name: str
    task_id: str
    kwargs: dict[str, Any]


def occurrence_message(keys: tuple[int, ...], queue: str, item: dict[str, Any]) -> OutgoingMessage:
    """The one-occurrence task message, as the relay publishes a lone occurrence and a
    worker republishes an envelope's item. Task id = occurrence id: a republished occurrence
    is recognisably the same task."""
    return OutgoingMessage(keys, queue, TASK_NAME, str(item["occurrence_id"]), item)


@dataclass(frozen=True)
class PublishResult:
    confirmed: dict[int, datetime]  # key -> confirm time (UTC)
    failed: dict[int, str]  # key -> reason (nack, unroutable, timeout)


class Publisher:
    def __init__(self, broker_url: str, *, prefix: str, partitions: int, celery_app: Any) -> None:
        self.broker_url = broker_url
        self.nodes = broker_urls(broker_url)
        # The node to try first on the next connect: after one that failed, the next one.
        self._node = 0
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
        """Connect to the first node that answers and declare the topology there.

        With several nodes, they are tried in turn starting after the last one that failed;
        a node that accepts the connection but fails the declare counts as failed too. Only
        when no node works is the last error raised.
        """
        error: Exception | None = None
        for _ in range(len(self.nodes)):
            # Raises when no node accepts a connection (the caller retries later).
            conn, index = connect_any(self.broker_url, start=self._node, heartbeat=0)
            self._node = index
            try:
                channel: Any = conn.channel()
                channel.confirm_select()
                channel.events["basic_ack"].add(self._on_ack)
                channel.events["basic_nack"].add(self._on_nack)
                channel.events["basic_return"].add(self._on_return)
                self._conn, self._channel, self._next_tag = conn, channel, 1
                self.declare_topology()
            except Exception as exc:  # noqa: BLE001 - this node cannot serve us: the next one
                self._conn = conn
                self._fail_over()
                if len(self.nodes) > 1:
                    log.warning("broker node %s: %s", node_address(self.nodes[index]), exc)
                error = exc
                continue
            if len(self.nodes) > 1:
                log.info("publishing through broker node %s", node_address(self.nodes[index]))
            return
        assert error is not None
        raise error

    def declare_topology(self) -> None:
        """Declare the exchange and every lane queue (idempotent) before any publish."""
        channel = self._channel
        exchange = exchange_name(self.prefix)
        channel.exchange_declare(exchange, "direct", durable=True, auto_delete=False)
        for name in all_queue_names(self.prefix, self.partitions):
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

    def _fail_over(self) -> None:
        """Drop a connection that failed; the next connect starts at the following node."""
        self.close()
        self._node = (self._node + 1) % len(self.nodes)

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
            self._fail_over()
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
            self._fail_over()
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
            # so start afresh (on the next node: this one may be cut off from the queue
            # leaders); the rows stay in the outbox and are republished (same ids).
            self._fail_over()
        return PublishResult(confirmed, failed)
