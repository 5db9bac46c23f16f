"""End to end with real processes: API -> materialize -> relay -> RabbitMQ -> Celery worker.

Nothing is mocked or eager: three subprocesses run the commands `make run` starts, against
the test database and the real broker (on a private queue prefix).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from apps.occurrences.models import Attempt, HandlerEffect, Occurrence
from apps.occurrences.tests.support.processes import ProcessStack, shared_stack_env

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def stack(queue_prefix: str, tmp_path: Path) -> Iterator[ProcessStack]:
    """materialize, relay and a Celery worker as real processes; stopped with SIGTERM."""
    env = shared_stack_env(
        queue_prefix,
    )
    processes = ProcessStack(tmp_path, env)
    for role in ("materialize", "relay", "worker"):
        processes.start_role(role)
    yield processes
    processes.stop_all()


def test_schedule_created_through_the_api_runs_on_a_real_worker(api_a, tenant_a, stack):
    # given: a one-shot due in a few seconds, created through the API
    run_at = timezone.now() + timedelta(seconds=6)
    response = api_a.post(
        "/api/v1/schedules",
        {
            "name": "e2e",
            "kind": "one_shot",
            "run_at": run_at.isoformat(),
            "time_zone": "Europe/Berlin",
            "handler": "record",
            "payload": {"e2e": True},
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    schedule_id = response.json()["id"]

    # when: the processes do their work
    deadline = time.monotonic() + 60
    occurrence = None
    while time.monotonic() < deadline:
        occurrence = Occurrence.objects.filter(schedule_id=schedule_id).first()
        if occurrence is not None and occurrence.state == Occurrence.State.SUCCEEDED:
            break
        stack.assert_alive()
        time.sleep(0.25)

    # then: one occurrence, one attempt, one effect, enqueued within the SLO
    assert occurrence is not None, "no occurrence was materialized"
    assert occurrence.state == Occurrence.State.SUCCEEDED, occurrence.state
    assert occurrence.attempt_count == 1
    attempts = Attempt.objects.filter(occurrence_id=occurrence.id)
    assert [a.outcome for a in attempts] == [Attempt.Outcome.SUCCEEDED]
    assert occurrence.enqueued_at is not None
    lag = (occurrence.enqueued_at - occurrence.scheduled_for).total_seconds()
    assert 0 <= lag < 5, f"lag {lag:.3f}s"
    effect = HandlerEffect.objects.get(occurrence_id=occurrence.id)
    assert effect.deliveries == 1 and effect.payload == {"e2e": True}
    sys.stdout.write(f"e2e lag enqueued_at - scheduled_for = {lag:.3f}s\n")


def test_fixed_rate_schedule_runs_on_a_real_worker_on_its_anchor(api_a, tenant_a, stack):
    # given: every minute from 20 s ahead (the processes' first lease and pass settle before
    # it), created through the API
    anchor = (timezone.now() + timedelta(seconds=20)).replace(microsecond=0)
    response = api_a.post(
        "/api/v1/schedules",
        {
            "name": "e2e interval",
            "kind": "interval",
            "interval_s": 60,
            "start_at": anchor.isoformat(),
            "time_zone": "America/New_York",
            "handler": "record",
            "payload": {"e2e": "interval"},
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    schedule_id = response.json()["id"]

    # when: the processes do their work
    deadline = time.monotonic() + 80
    first = None
    while time.monotonic() < deadline:
        first = Occurrence.objects.filter(schedule_id=schedule_id, scheduled_for=anchor).first()
        if first is not None and first.state == Occurrence.State.SUCCEEDED:
            break
        stack.assert_alive()
        time.sleep(0.25)

    # then: the anchor ran once, on time, and the following instants are a minute apart
    assert first is not None, "no occurrence was materialized"
    assert first.state == Occurrence.State.SUCCEEDED, first.state
    assert first.enqueued_at is not None
    lag = (first.enqueued_at - first.scheduled_for).total_seconds()
    assert 0 <= lag < 5, f"lag {lag:.3f}s"
    effect = HandlerEffect.objects.get(occurrence_id=first.id)
    assert effect.deliveries == 1 and effect.payload == {"e2e": "interval"}
    instants = sorted(
        Occurrence.objects.filter(schedule_id=schedule_id).values_list("scheduled_for", flat=True)
    )
    assert instants[0] == anchor and len(instants) >= 2
    assert all(b - a == timedelta(seconds=60) for a, b in zip(instants, instants[1:], strict=False))
    sys.stdout.write(f"e2e interval lag enqueued_at - scheduled_for = {lag:.3f}s\n")
