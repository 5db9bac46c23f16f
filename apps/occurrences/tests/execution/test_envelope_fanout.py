"""Envelopes fan out: a relay envelope's occurrences start as soon as worker slots are free,
and an envelope whose items the broker did not confirm is handed back, never acknowledged.

The start test runs the real materializer pass and relay step (so the envelope is exactly
what the relay publishes), a real prefork worker with 4 slots consuming only the envelope's
queue (an item republished elsewhere would never run), RabbitMQ and PostgreSQL.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery.exceptions import Reject
from django.conf import settings
from django.utils import timezone

from apps.occurrences.execution import tasks
from apps.occurrences.execution.fanout import FanOutFailed, envelope_fan_out
from apps.occurrences.models import Attempt, Lane, Occurrence, ShardLease
from apps.occurrences.pipeline.broker import Publisher, PublishResult
from apps.occurrences.pipeline.materializer import materialize_pass
from apps.occurrences.pipeline.queues import queue_name, tenant_partition
from apps.occurrences.pipeline.relay import OutboxRow, build_messages, relay_step
from apps.occurrences.tests.support.pipeline import leases, materialize_config, relay_config
from apps.occurrences.tests.support.processes import (
    ProcessStack,
    free_port,
    role_argv,
    shared_stack_env,
)
from apps.occurrences.tests.support.rows import occurrence, schedule
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule
from apps.tenants.models import Tenant

SLOTS = 4
ENVELOPE = 20
HANDLER_S = 1


def _wait(predicate: Callable[[], Any], timeout: float, what: str, stack: ProcessStack) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        stack.assert_alive()
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def stack(tmp_path: Path, queue_prefix: str, transactional_db: Any) -> Iterator[ProcessStack]:
    env = shared_stack_env(
        queue_prefix,
        # One tenant alone on the worker: what is measured is the fan-out, not the share of
        # slots a tenant may hold when others compete (test_fair_share.py).
        TICK_TENANT_SLOT_SHARE="1",
    )
    s = ProcessStack(tmp_path, env)
    yield s
    s.stop_all()


def _burst(tenant: Tenant, count: int) -> None:
    """`count` one-shots of one tenant due at one instant, materialized: the relay's next
    step puts them in one envelope."""
    run_at = timezone.now() - timedelta(seconds=1)
    for index in range(count):
        make_schedule(
            tenant, kind=Schedule.Kind.ONE_SHOT, expression="", run_at=run_at,
            next_run_at=run_at, name=f"burst {index}", payload={"sleep_s": HANDLER_S},
        )  # fmt: skip
    materialize_pass(leases=leases(), now=timezone.now(), config=materialize_config())


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_envelope_of_20_starts_4_at_once_on_4_free_slots(tenant_a, queue_prefix, publisher, stack):
    # given: a worker with 4 free slots, consuming only the tenant's strict queue
    queue = queue_name(
        queue_prefix, Lane.STRICT, tenant_partition(tenant_a.id, settings.TICK_TENANT_PARTITIONS)
    )
    stack.start("worker", [*role_argv("worker", concurrency=SLOTS), "-Q", queue])
    _wait(lambda: "ready" in stack.log_text("worker"), 60, "the worker to be ready", stack)
    _burst(tenant_a, ENVELOPE)

    # when: the relay publishes the burst as one envelope
    result = relay_step(
        leases=leases(ShardLease.Role.RELAY), publisher=publisher, config=relay_config(queue_prefix)
    )
    assert (result.published, result.messages) == (ENVELOPE, 1)
    published_at = timezone.now()

    # then: every occurrence runs once, 4 at a time from the start
    _wait(
        lambda: Occurrence.objects.filter(state=Occurrence.State.SUCCEEDED).count() == ENVELOPE,
        ENVELOPE * HANDLER_S + 30, "every occurrence to succeed", stack,
    )  # fmt: skip
    attempts = list(Attempt.objects.order_by("started_at").values_list("started_at", "worker_id"))
    assert len(attempts) == ENVELOPE  # one attempt each: duplicates, if any, dropped at claim
    starts = [(started - published_at).total_seconds() for started, _ in attempts]
    sys.stdout.write(f"start after publish: first {starts[0]:.2f}s, 4th {starts[3]:.2f}s, "
                     f"last {starts[-1]:.2f}s\n")  # fmt: skip
    assert starts[3] - starts[0] < 1.0, starts
    assert len({worker for _, worker in attempts[:SLOTS]}) == SLOTS  # four pool processes
    # Serially the last would start 19 s after the first; in parallel ~4 s.
    assert starts[-1] - starts[0] < ENVELOPE * HANDLER_S / SLOTS + 2, starts


def _envelope(tenant: Tenant, count: int, prefix: str) -> dict[str, Any]:
    """The arguments of the relay's envelope for `count` occurrences of `tenant` due now."""
    at = timezone.now()
    occs = [occurrence(schedule(tenant, name=f"item {i}"), at) for i in range(count)]
    rows = [
        OutboxRow(index, str(occ.id), at, str(occ.schedule_id), occ.schedule_version,
                  str(tenant.id), occ.lane, at, 0)
        for index, occ in enumerate(occs)
    ]  # fmt: skip
    [[message]] = build_messages(rows, relay_config(prefix))
    return dict(message.kwargs)


@pytest.mark.django_db(transaction=True)
def test_envelope_not_confirmed_by_the_broker_is_requeued_and_runs_nothing(
    tenant_a, queue_prefix, monkeypatch, settings
):
    # given: an envelope of 3, and a worker publisher whose broker refuses connections
    settings.TICK_WORKER_OUTAGE_RETRY_S = 1
    envelope = _envelope(tenant_a, 3, queue_prefix)
    refusing = Publisher(
        f"amqp://guest:guest@127.0.0.1:{free_port()}//", prefix=queue_prefix,
        partitions=settings.TICK_TENANT_PARTITIONS, celery_app=tasks.run_occurrences.app,
    )  # fmt: skip
    monkeypatch.setattr(tasks, "worker_publisher", lambda _app: refusing)

    # when: the envelope task runs
    outcome = tasks.run_occurrences.apply(kwargs=envelope)

    # then: the message is rejected with requeue (not acknowledged), and no item ran here
    assert isinstance(outcome.result, Reject), outcome.result
    reason, requeue = outcome.result.args
    assert requeue is True
    assert isinstance(reason, FanOutFailed)
    assert not Attempt.objects.exists()
    assert set(Occurrence.objects.values_list("state", flat=True)) == {Occurrence.State.ENQUEUED}


class _FlakyPublisher:
    """Confirms every message but the first on the first publish, all on the next."""

    def __init__(self) -> None:
        self.published: list[list[str]] = []

    def publish(self, messages: list[Any], *, timeout_s: float) -> PublishResult:
        self.published.append([m.task_id for m in messages])
        first_try = len(self.published) == 1
        keys = [m.keys[0] for m in messages]
        failed = {keys[0]: "nacked by broker"} if first_try else {}
        now = timezone.now()
        return PublishResult({k: now for k in keys if k not in failed}, failed)


def test_fan_out_republishes_only_the_unconfirmed_items_then_succeeds():
    items = [{"occurrence_id": f"occ-{i}", "tenant_id": "t", "lane": "strict"} for i in range(3)]
    publisher = _FlakyPublisher()

    published = envelope_fan_out(items, queue="q", publisher=publisher)  # type: ignore[arg-type]

    assert published == 3
    assert publisher.published == [["occ-0", "occ-1", "occ-2"], ["occ-0"]]


def test_fan_out_still_unconfirmed_after_the_retry_raises():
    class Nacking(_FlakyPublisher):
        def publish(self, messages: list[Any], *, timeout_s: float) -> PublishResult:
            self.published.append([m.task_id for m in messages])
            return PublishResult({}, {m.keys[0]: "nacked by broker" for m in messages})

    publisher = Nacking()
    with pytest.raises(FanOutFailed, match="2 of 2 items not confirmed"):
        envelope_fan_out([{"occurrence_id": "a"}, {"occurrence_id": "b"}], queue="q",
                         publisher=publisher, give_up_after_s=0.5)  # type: ignore[arg-type]  # fmt: skip
    assert len(publisher.published) >= 2
