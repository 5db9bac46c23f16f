"""Broker faults with real processes: nothing is lost when RabbitMQ loses a node.

materialize, relay and Celery workers run as subprocesses (support/processes.py) against the
test database and private RabbitMQ nodes (support/private_rabbitmq.py, booted by this
folder's conftest.py), never the shared broker:
- a 3-node cluster whose node leading the lane queues is SIGKILLed during a burst, with
  every node listed in CELERY_BROKER_URL (`;`), so relay and workers fail over;
- a single node whose RabbitMQ application is stopped for 3 s during a stream.
Timings (node boot, recovery) are printed: run with `-s` to see them.
"""

from __future__ import annotations

import re
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.db.models import Max, Min
from django.utils import timezone

from apps.occurrences.audit.stuck import queue_depths
from apps.occurrences.models import Attempt, HandlerEffect, Occurrence
from apps.occurrences.pipeline.broker import OutgoingMessage, Publisher
from apps.occurrences.pipeline.queues import TASK_NAME, queue_name, tenant_partition
from apps.occurrences.tests.support.private_rabbitmq import PrivateRabbitMQ
from apps.occurrences.tests.support.processes import (
    ProcessStack,
    database_url,
    free_port,
    stack_env,
)
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule
from apps.tenants.models import Tenant
from apps.tenants.services import tenant_create
from tickweb.celery import app as celery_app

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PARTITIONS = settings.TICK_TENANT_PARTITIONS


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _wait_for(predicate: Callable[[], bool], timeout_s: float, stack: ProcessStack) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        stack.assert_alive()
        time.sleep(0.1)
    return False


@pytest.fixture
def prefix() -> str:
    # Private nodes are deleted after the module: no topology to clean up on the broker.
    return f"tick-faults-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def start_stack(prefix: str, tmp_path: Path) -> Iterator[Callable[[PrivateRabbitMQ], ProcessStack]]:
    """Starts materialize, relay and two workers on a restored broker and waits for the
    workers; what it started is stopped (SIGTERM, logs printed) before the database flush."""
    started: list[ProcessStack] = []

    def start(rabbit: PrivateRabbitMQ) -> ProcessStack:
        rabbit.restore()
        env = stack_env(
            database_url=database_url(connection.settings_dict),
            broker_url=rabbit.broker_url,
            queue_prefix=prefix,
            # One message per occurrence: the most messages in flight when a node goes.
            TICK_RELAY_ENVELOPE_MAX="1",
        )
        stack = ProcessStack(tmp_path, env)
        started.append(stack)
        stack.start_role("materialize")
        stack.start_role("relay")
        stack.start_role("worker", name="worker1")
        stack.start_role("worker", name="worker2")
        ready = _wait_for(
            lambda: all(" ready." in stack.log_text(w) for w in ("worker1", "worker2")),
            60,
            stack,
        )
        assert ready, stack.log_tail("worker1") + stack.log_tail("worker2")
        return stack

    yield start
    for stack in started:
        stack.stop_all()


def _one_shots(tenants: list[Tenant], run_at: datetime, count: int, tag: str) -> list[Schedule]:
    return [
        make_schedule(
            tenants[i % len(tenants)],
            name=f"{tag}-{i}",
            kind=Schedule.Kind.ONE_SHOT,
            expression="",
            run_at=run_at,
            handler="record",
            payload={"tag": tag},
        )
        for i in range(count)
    ]


def _succeeded() -> int:
    return Occurrence.objects.filter(state=Occurrence.State.SUCCEEDED).count()


def _check_nothing_lost(schedules: list[Schedule]) -> list[HandlerEffect]:
    """One occurrence per one-shot, SUCCEEDED, with exactly one effect; returns the effects
    that saw more than one delivery (always of their own occurrence id)."""
    occurrences = list(Occurrence.objects.all())
    per_schedule = Counter(o.schedule_id for o in occurrences)
    assert set(per_schedule) == {s.id for s in schedules}
    assert max(per_schedule.values()) == 1, "a schedule fired under two occurrence ids"
    states = Counter(o.state for o in occurrences)
    assert states == {Occurrence.State.SUCCEEDED: len(schedules)}, states
    effects = list(HandlerEffect.objects.all())
    assert len(effects) == len(schedules)
    assert {e.occurrence_id for e in effects} == {o.id for o in occurrences}
    redelivered = [e for e in effects if e.deliveries > 1]
    attempts = Counter(
        Attempt.objects.filter(occurrence_id__in=[e.occurrence_id for e in redelivered])
        .values_list("occurrence_id", flat=True)
    )  # fmt: skip
    _say(f"effects delivered more than once (same occurrence id): {len(redelivered)}")
    for effect in redelivered:
        _say(
            f"  {effect.occurrence_id}: deliveries={effect.deliveries} "
            f"attempts={attempts[effect.occurrence_id]}"
        )
    return redelivered


def _say_duplicates(stack: ProcessStack) -> None:
    """Redelivered messages the claim dropped (their ack was lost with the node)."""
    dropped = [
        line
        for name in stack.procs
        if name.startswith("worker")
        for line in stack.log_text(name).splitlines()
        if "not run: duplicate" in line
    ]
    _say(f"same-id redeliveries dropped as duplicates by the claim: {len(dropped)}")
    for line in dropped:
        _say(f"  {line[:160]}")


def _log_lines(stack: ProcessStack, name: str, pattern: str, limit: int = 6) -> list[str]:
    lines = [ln for ln in stack.log_text(name).splitlines() if re.search(pattern, ln)]
    return lines[:limit]


def test_cluster_loses_the_node_leading_the_queues_mid_burst(
    rabbitmq_cluster: PrivateRabbitMQ,
    prefix: str,
    start_stack: Callable[[PrivateRabbitMQ], ProcessStack],
) -> None:
    cluster = rabbitmq_cluster
    stack = start_stack(cluster)
    tenants = [tenant_create(slug=f"burst-{i}") for i in range(3)]
    queues = {queue_name(prefix, "strict", tenant_partition(t.id, PARTITIONS)) for t in tenants}

    # given: 300 strict one-shots due at one instant T, and 60 more at T + 5 s (published
    # after the node is gone, so the relay has to fail over too)
    began = time.monotonic()
    instant = timezone.now() + timedelta(seconds=10)
    burst = _one_shots(tenants, instant, 300, "burst")
    late = _one_shots(tenants, instant + timedelta(seconds=5), 60, "late")
    _say(f"created 360 schedules in {time.monotonic() - began:.1f}s")
    leaders = cluster.queue_leaders()
    in_use = Counter(leaders[q] for q in queues)
    victim = cluster.node_named(in_use.most_common(1)[0][0])
    _say(f"strict queues in use {sorted(queues)} led by {dict(in_use)}; victim {victim.name}")

    # when: the leader is killed once the burst is being worked on
    assert timezone.now() < instant, "schedules took too long to create"
    working = _wait_for(lambda: HandlerEffect.objects.count() >= 30, 30, stack)
    assert working, "the burst did not start"
    killed_at = timezone.now()
    cluster.kill_node(victim)
    done_before = _succeeded()
    _say(f"killed {victim.name} at T+{(killed_at - instant).total_seconds():.2f}s, "
         f"{done_before} of 360 succeeded by then")  # fmt: skip
    finished = _wait_for(lambda: _succeeded() == 360, 90, stack)

    # then: everything succeeded exactly once, and every process is still up
    stack.assert_alive()
    span = Occurrence.objects.aggregate(first=Min("finished_at"), last=Max("finished_at"))
    new_leaders = cluster.queue_leaders()
    _say(f"queues now led by {dict(Counter(new_leaders[q] for q in queues))}")
    for name in ("relay", "worker1", "worker2"):
        for line in _log_lines(stack, name, r"broker|[Cc]onnection|unavailable|back after"):
            _say(f"  {name}: {line[:200]}")
    assert finished, f"{_succeeded()} of 360 succeeded"
    resumed = Attempt.objects.filter(started_at__gt=killed_at).aggregate(first=Min("started_at"))
    burst_done = Occurrence.objects.filter(schedule_id__in=[s.id for s in burst]).aggregate(
        last=Max("finished_at")
    )["last"]
    late_lag = max(
        (enqueued - due).total_seconds()
        for enqueued, due in Occurrence.objects.filter(
            schedule_id__in=[s.id for s in late]
        ).values_list("enqueued_at", "scheduled_for")
        if enqueued is not None
    )
    _say(
        "after the kill: a worker started an attempt in "
        f"{(resumed['first'] - killed_at).total_seconds():.2f}s, the burst was done in "
        f"{(burst_done - killed_at).total_seconds():.2f}s, the late wave was enqueued with "
        f"lag <= {late_lag:.2f}s; recovery (kill -> last occurrence succeeded): "
        f"{(span['last'] - killed_at).total_seconds():.2f}s"
    )
    _check_nothing_lost(burst + late)
    _say_duplicates(stack)


def test_single_node_restart_during_a_stream(
    private_rabbitmq: PrivateRabbitMQ,
    start_stack: Callable[[PrivateRabbitMQ], ProcessStack],
) -> None:
    rabbit = private_rabbitmq
    node = rabbit.nodes[0]
    stack = start_stack(rabbit)
    tenant = tenant_create(slug="stream")

    # given: a stream of one-shots, 4 due every second for 16 s
    start = timezone.now() + timedelta(seconds=4)
    schedules: list[Schedule] = []
    for second in range(16):
        schedules += _one_shots([tenant], start + timedelta(seconds=second), 4, f"s{second}")

    # when: RabbitMQ stops 5 s into the stream and comes back 3 s later
    assert _wait_for(lambda: timezone.now() >= start + timedelta(seconds=5), 30, stack)
    stopped_at = timezone.now()
    rabbit.stop_app(node)
    time.sleep(3)
    # The node can be back no earlier than start_app is called; on a loaded machine the
    # command itself may return after the relay and workers have already resumed.
    back_at = timezone.now()
    rabbit.start_app(node)
    _say(
        f"node down {(back_at - stopped_at).total_seconds():.1f}s (stop_app, 3 s), "
        f"start_app returned after {(timezone.now() - back_at).total_seconds():.1f}s"
    )
    finished = _wait_for(lambda: _succeeded() == len(schedules), 90, stack)

    # then: nothing lost, processes alive, relay and workers resumed by themselves
    stack.assert_alive()
    for name in ("relay", "worker1", "worker2"):
        for line in _log_lines(stack, name, r"broker|[Cc]onnection|unavailable|back after"):
            _say(f"  {name}: {line[:200]}")
    assert finished, f"{_succeeded()} of {len(schedules)} succeeded"
    resumed = Occurrence.objects.filter(enqueued_at__gte=back_at).aggregate(
        first=Min("enqueued_at")
    )["first"]
    ran = Attempt.objects.filter(started_at__gte=back_at).aggregate(first=Min("started_at"))[
        "first"
    ]
    last = Occurrence.objects.aggregate(last=Max("finished_at"))["last"]
    assert resumed is not None and ran is not None
    _say(
        f"after the node was back: relay published in {(resumed - back_at).total_seconds():.2f}s,"
        f" a worker started an attempt in {(ran - back_at).total_seconds():.2f}s, "
        f"last occurrence done {(last - back_at).total_seconds():.2f}s"
    )
    _check_nothing_lost(schedules)
    _say_duplicates(stack)


def test_publisher_and_queue_depths_skip_a_dead_node_in_the_list(
    private_rabbitmq: PrivateRabbitMQ,
    prefix: str,
) -> None:
    # given: a node list whose first entry nobody listens on
    rabbit = private_rabbitmq
    rabbit.restore()
    url = f"amqp://guest:guest@127.0.0.1:{free_port()}//;{rabbit.broker_url}"
    publisher = Publisher(url, prefix=prefix, partitions=PARTITIONS, celery_app=celery_app)
    try:
        # when: publishing through it
        message = OutgoingMessage(
            keys=(1,),
            queue=queue_name(prefix, "strict", 0),
            task_name=TASK_NAME,
            task_id=str(uuid.uuid4()),
            kwargs={"occurrence_id": str(uuid.uuid4())},
        )
        result = publisher.publish([message])

        # then: the live node confirmed it, and queue depths read through the list too
        assert set(result.confirmed) == {1} and not result.failed
        assert publisher._node == 1
        assert queue_depths(url, prefix, PARTITIONS)["strict"] == 1
    finally:
        publisher.delete_topology()
        publisher.close()
