"""Run now and backfill racing themselves: the schedule lock and the deterministic ids leave
one occurrence per request id and per instant."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from apps.occurrences.manual_runs import BackfillOnly, schedule_backfill, schedule_run_now
from apps.occurrences.models import DispatchOutbox, Occurrence
from apps.occurrences.tests.support import rows

pytestmark = pytest.mark.django_db(transaction=True)


def _together(call: Callable[[], Any], n: int = 4) -> list[Any]:
    """Run `call` in `n` threads released at once; each on its own connection."""
    barrier = threading.Barrier(n)
    results: list[Any] = []

    def worker() -> None:
        try:
            barrier.wait()
            results.append(call())
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results


def test_concurrent_run_now_with_one_request_id_creates_one_occurrence(tenant_a):
    schedule = rows.schedule(tenant_a)

    receipts = _together(
        lambda: schedule_run_now(schedule=schedule, actor="test", request_id="same")
    )

    assert len(receipts) == 4
    assert len({r.occurrence for r in receipts}) == 1
    assert sorted(r.replayed for r in receipts) == [False, True, True, True]
    manual = Occurrence.objects.filter(schedule=schedule, origin=Occurrence.Origin.MANUAL)
    assert manual.count() == 1
    assert DispatchOutbox.objects.filter(occurrence_id=manual.get().id).count() == 1


def test_concurrent_backfills_of_one_range_queue_each_instant_once(tenant_a):
    schedule = rows.schedule(tenant_a)
    top = timezone.now().astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    start, end = top - timedelta(hours=6), top

    receipts = _together(
        lambda: schedule_backfill(
            schedule=schedule, actor="test", start=start, end=end, only=BackfillOnly.MISSED
        )
    )

    assert sorted(r.queued for r in receipts) == [0, 0, 0, 6]
    assert {r.already_done for r in receipts if r.queued == 0} == {6}
    backfilled = Occurrence.objects.filter(schedule=schedule, origin="backfill")
    assert sorted(o.scheduled_for for o in backfilled) == [
        start + timedelta(hours=h) for h in range(6)
    ]
    assert DispatchOutbox.objects.filter(schedule_id=schedule.id).count() == 6
