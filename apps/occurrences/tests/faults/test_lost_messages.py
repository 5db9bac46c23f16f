"""Messages the broker lost after they were acknowledged as published are not lost runs: the
reaper's backstop republishes occurrences left ENQUEUED with no attempt (real processes,
real RabbitMQ on a private queue prefix, the test database)."""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path

import amqp
import pytest
from django.conf import settings
from django.utils import timezone

from apps.occurrences.models import HandlerEffect, Occurrence
from apps.occurrences.pipeline.queues import all_queue_names
from apps.occurrences.tests.support.processes import ProcessStack, shared_stack_env
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

REDELIVER_AFTER_S = 4
BURST = 40


def _purge(prefix: str) -> int:
    """Drop every ready message of the prefix's queues, as a lost node or an operator's
    purge would: the broker had confirmed them, no worker ever saw them."""
    url = settings.CELERY_BROKER_URL.split(";")[0]
    host = url.split("@")[-1].split("/")[0]
    conn = amqp.Connection(host=host, userid="guest", password="guest")
    conn.connect()
    channel = conn.channel()
    purged = sum(channel.queue_purge(name) or 0 for name in all_queue_names(
        prefix, settings.TICK_TENANT_PARTITIONS))  # fmt: skip
    conn.close()
    return purged


def _wait(predicate, timeout_s: float, stack: ProcessStack, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if predicate():
            return time.monotonic() - started
        stack.assert_alive()
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout_s} s")


def test_purged_messages_are_republished_by_the_backstop_and_run_once(
    tenant_a, tenant_b, queue_prefix: str, tmp_path: Path
) -> None:
    # given: a burst due in a few seconds, relayed while no worker consumes
    run_at = (timezone.now() + timedelta(seconds=4)).replace(microsecond=0)
    for n in range(BURST):
        make_schedule(tenant_a if n % 2 else tenant_b, kind=Schedule.Kind.ONE_SHOT,
                      expression="", run_at=run_at, name=f"lost-{n}")  # fmt: skip
    env = shared_stack_env(
        queue_prefix,
    )
    stack = ProcessStack(tmp_path, env)
    stack.start_role("materialize")
    stack.start_role("relay")
    stack.start_role("reap", redeliver_after=REDELIVER_AFTER_S, interval=0.5, scan_interval=0)
    try:
        enqueued = Occurrence.objects.filter(state=Occurrence.State.ENQUEUED)
        _wait(lambda: enqueued.count() == BURST, 30, stack, "burst enqueued")

        # when: the broker loses every message of the burst, then a worker starts
        assert _purge(queue_prefix) > 0
        purged_at = time.monotonic()
        stack.start_role("worker", concurrency=2)

        # then: within the bound (plus a reaper pass and a relay step) all of them run
        succeeded = Occurrence.objects.filter(state=Occurrence.State.SUCCEEDED)
        _wait(lambda: succeeded.count() == BURST, REDELIVER_AFTER_S + 30, stack, "all ran")
        recovery = time.monotonic() - purged_at
        occurrences = list(Occurrence.objects.all())
        assert [o.redelivery_count for o in occurrences] == [1] * BURST
        assert [o.attempt_count for o in occurrences] == [1] * BURST
        effects = HandlerEffect.objects.filter(occurrence_id__in=[o.id for o in occurrences])
        assert sorted(e.deliveries for e in effects) == [1] * BURST
        stack.assert_alive()
        sys.stdout.write(
            f"purged burst of {BURST} republished and SUCCEEDED {recovery:.1f} s after the "
            f"purge (bound {REDELIVER_AFTER_S} s)\n"
        )
    finally:
        stack.stop_all()
