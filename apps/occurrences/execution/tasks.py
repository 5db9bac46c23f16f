"""Celery entry point: the relay publishes `tick.run_occurrence` messages to the lane queues,
and `tick.run_occurrences` envelopes for bursts, which the worker fans out (fanout.py).

Hardening (settings.py): JSON only (a pickled message is refused before deserialization),
`acks_late` + `reject_on_worker_lost`, prefetch multiplier 1; the queues carry a delivery
limit (queues.py). Duplicates and crashes are absorbed by the claim, not by the broker.

Acknowledgement rule: a message is acknowledged only once each occurrence it carries was
claimed (or found finished) in the database, or, for an envelope's items 2..n, republished
with the broker's confirm. When an outage outlasts the worker's retries
(run.occurrence_execute) the message is rejected with requeue, never acknowledged;
whatever the broker still loses, the reaper's backstop republishes (docs/decisions.md).
"""

from __future__ import annotations

import logging
import os
import uuid
from datetime import datetime
from typing import Any

from celery import shared_task
from celery.exceptions import Reject

from apps.occurrences.execution.envelope_run import (
    EnvelopeRun,
    envelope_run_claim,
    envelope_run_execute,
)
from apps.occurrences.execution.fanout import (
    FanOutFailed,
    envelope_fan_out,
    envelope_queue,
    worker_publisher,
)
from apps.occurrences.execution.run import occurrence_execute
from apps.occurrences.observability import metrics
from apps.occurrences.pipeline.outages import outage_of
from apps.occurrences.pipeline.queues import ENVELOPE_TASK_NAME, TASK_NAME

log = logging.getLogger(__name__)


def _execute_item(item: dict[str, Any], worker_id: str) -> str:
    """Run one occurrence; an outage that outlasted the retries hands the message back."""
    try:
        summary = occurrence_execute(
            occurrence_id=uuid.UUID(item["occurrence_id"]),
            scheduled_for=datetime.fromisoformat(item["scheduled_for"]),
            worker_id=worker_id,
        )
    except Exception as exc:
        if outage_of(exc) is None:
            raise
        metrics.worker_requeues.inc()
        log.warning("occurrence %s: outage outlasted the worker's retries (%r); message "
                    "requeued", item.get("occurrence_id"), exc)  # fmt: skip
        raise Reject(exc, requeue=True) from exc
    return str(summary["status"])


def _worker_id(task: Any) -> str:
    # The pid tells operators (and the crash tests) which pool process ran the attempt.
    return f"{task.request.hostname or 'worker'}:{os.getpid()}"


@shared_task(
    name=TASK_NAME, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True
)
def run_occurrence(self: Any, /, occurrence_id: str, scheduled_for: str, **_: Any) -> str:
    item = {"occurrence_id": occurrence_id, "scheduled_for": scheduled_for}
    return _execute_item(item, _worker_id(self))


@shared_task(
    name=ENVELOPE_TASK_NAME,
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def run_occurrences(
    self: Any,
    /,
    occurrences: list[dict[str, Any]],
    tenant_id: str | None = None,
    lane: str | None = None,
    **_: Any,
) -> list[str]:
    """An envelope of occurrences due at one instant (relay bursts): items 2..n go back to
    the same queue as one-occurrence messages, so free slots start them at once (fanout.py);
    this slot then runs item 1. Not confirmed, the envelope is handed back whole; its
    finished items are dropped at claim when it is redelivered. The envelope says its tenant
    and lane once; envelopes of earlier relays said them in every item."""
    if not occurrences:
        return []
    first = occurrences[0]
    origin = {**first, **({"tenant_id": tenant_id, "lane": lane} if tenant_id and lane else {})}
    queue = envelope_queue(self.request.delivery_info, origin)
    run = _run_claim(occurrences, _worker_id(self))
    if run.claims:
        return _run_and_fan_out(self, run, queue=queue)
    if occurrences[1:]:
        _fan_out_or_requeue(self, occurrences[1:], queue=queue)
    return [_execute_item(first, _worker_id(self))]


def _run_claim(occurrences: list[dict[str, Any]], worker_id: str) -> EnvelopeRun:
    """The envelope's run (envelope_run.py); an outage forms none: the items fan out and
    each claim rides it out on its own."""
    try:
        return envelope_run_claim(occurrences, worker_id=worker_id)
    except Exception as exc:
        if outage_of(exc) is None:
            raise
        log.warning("envelope run not claimed (%r); its items fan out", exc)
        return EnvelopeRun(rest=list(occurrences))


def _run_and_fan_out(task: Any, run: EnvelopeRun, *, queue: str) -> list[str]:
    """Fan out the items not in the run, then run it. Its attempts are committed: the run
    goes on even when the fan-out failed, and the envelope is handed back after it (its
    finished items are then dropped at claim)."""
    handed_back: Reject | None = None
    if run.rest:
        try:
            _fan_out_or_requeue(task, run.rest, queue=queue)
        except Reject as exc:
            handed_back = exc
    statuses = envelope_run_execute(run)
    if handed_back is not None:
        raise handed_back
    return statuses


def _fan_out_or_requeue(task: Any, items: list[dict[str, Any]], *, queue: str) -> None:
    try:
        envelope_fan_out(items, queue=queue, publisher=worker_publisher(task.app))
    except FanOutFailed as exc:
        metrics.worker_requeues.inc()
        log.warning("envelope %s: fan-out to %s failed (%s); message requeued",
                    task.request.id, queue, exc)  # fmt: skip
        raise Reject(exc, requeue=True) from exc
