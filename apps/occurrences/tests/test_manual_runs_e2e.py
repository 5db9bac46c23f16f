"""Run now and backfill delivered end to end: API -> relay -> RabbitMQ -> Celery worker, as
real processes on the test database and the machine's broker (no mock, no eager Celery)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from apps.occurrences.models import Attempt, HandlerEffect, Lane, Occurrence
from apps.occurrences.tests.support import rows
from apps.occurrences.tests.support.processes import ProcessStack, shared_stack_env

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def stack(queue_prefix: str, tmp_path: Path) -> Iterator[ProcessStack]:
    """relay and a Celery worker as real processes (no materializer: only the runs asked
    for are due)."""
    processes = ProcessStack(tmp_path, shared_stack_env(queue_prefix))
    for role in ("relay", "worker"):
        processes.start_role(role)
    yield processes
    processes.stop_all()


def _hour(hours_ago: int) -> datetime:
    top = timezone.now().astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return top - timedelta(hours=hours_ago)


def test_run_now_and_backfill_run_once_each_on_a_real_worker(api_a, tenant_a, stack):
    # given: an hourly schedule whose runs 2 h and 1 h ago were missed
    schedule = rows.schedule(tenant_a, payload={"job": "export"})
    for hours in (2, 1):
        rows.occurrence(schedule, _hour(hours), state=Occurrence.State.MISSED)

    # when: run now is sent twice with one request id, and the missed hours are backfilled
    ran = [
        api_a.post(f"/api/v1/schedules/{schedule.id}/run", {"request_id": "e2e-1"}, format="json")
        for _ in range(2)
    ]
    backfill = api_a.post(
        f"/api/v1/schedules/{schedule.id}/backfill",
        {"from": _hour(2).isoformat(), "to": _hour(0).isoformat()},
        format="json",
    )
    assert [r.status_code for r in ran] == [202, 202] and backfill.status_code == 202
    assert backfill.json()["receipt"]["queued"] == 2
    wanted = Occurrence.objects.filter(schedule=schedule).exclude(origin="scheduled")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        asked = list(wanted.all())  # read again each time: a queryset caches its rows
        if sorted(o.state for o in asked) == ["SUCCEEDED"] * 3:
            break
        stack.assert_alive()
        time.sleep(0.25)

    # then: three runs, each once, on its lane, the backfilled ones at their own instants
    done = {o.origin: o for o in asked}
    assert sorted(o.state for o in asked) == ["SUCCEEDED"] * 3, [o.state for o in asked]
    assert str(done["manual"].id) == ran[0].json()["receipt"]["occurrence"]
    assert done["manual"].lane == Lane.STRICT
    effects = {e.occurrence_id: e for e in HandlerEffect.objects.filter(schedule_id=schedule.id)}
    assert set(effects) == {o.id for o in asked}
    assert {e.deliveries for e in effects.values()} == {1}
    assert {e.payload["job"] for e in effects.values()} == {"export"}
    backfilled = sorted((o for o in asked if o.origin == "backfill"), key=lambda o: o.scheduled_for)
    assert [effects[o.id].scheduled_for for o in backfilled] == [_hour(2), _hour(1)]
    assert {o.lane for o in backfilled} == {Lane.CATCHUP}
    assert all(o.enqueued_at is not None for o in asked)
    assert Attempt.objects.filter(occurrence_id__in=[o.id for o in asked]).count() == 3
