"""Races on real PostgreSQL: each thread has its own connection and its own transactions."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.occurrences.models import DispatchOutbox, Occurrence
from apps.occurrences.pipeline.materializer import materialize_batch
from apps.occurrences.pipeline.partitions import partitions_ensure
from apps.occurrences.tests.support.pipeline import leases, materialize_config
from apps.schedules.models import Schedule, ScheduleVersion
from apps.schedules.tests.factories import make_schedule
from apps.tenants.tests.races import run_at_once

pytestmark = pytest.mark.django_db(transaction=True)

CRON = {"name": "race", "kind": "cron", "expression": "0 * * * *", "handler": "record"}


def test_twenty_concurrent_creates_with_one_idempotency_key_make_one_schedule(tenant_a, api_a):
    tenant_a.api_rate_per_min = 10_000
    tenant_a.save(update_fields=["api_rate_per_min"])

    responses = run_at_once(20, lambda i: api_a.post(
        "/api/v1/schedules", CRON, format="json", HTTP_IDEMPOTENCY_KEY="same-key"
    ))  # fmt: skip

    assert [getattr(r, "status_code", r) for r in responses] == [201] * 20
    assert len({r.json()["id"] for r in responses}) == 1
    assert sum(1 for r in responses if not r.has_header("Idempotent-Replayed")) == 1
    assert Schedule.objects.filter(tenant=tenant_a).count() == 1


def test_fifty_concurrent_creates_at_the_quota_edge_admit_exactly_the_quota(tenant_a, api_a):
    tenant_a.max_active_schedules = 12
    tenant_a.api_rate_per_min = 10_000
    tenant_a.save(update_fields=["max_active_schedules", "api_rate_per_min"])
    make_schedule(tenant_a)
    make_schedule(tenant_a)  # 2 of 12 used: 10 slots left

    responses = run_at_once(50, lambda i: api_a.post(
        "/api/v1/schedules", {**CRON, "name": f"race {i}"}, format="json"
    ))  # fmt: skip

    codes = Counter(getattr(r, "status_code", repr(r)) for r in responses)
    assert codes == Counter({201: 10, 409: 40})
    assert Schedule.objects.filter(tenant=tenant_a, state="ACTIVE").count() == 12


def test_update_racing_the_materializer_leaves_no_old_version_to_publish(tenant_a, api_a):
    # given: 40 due every-minute schedules; the materializer works in batches of 5 while
    # every schedule is PATCHed concurrently
    now = timezone.now()
    partitions_ensure({now.date(), (now + timedelta(minutes=5)).date()})
    tenant_a.api_rate_per_min = 10_000
    tenant_a.save(update_fields=["api_rate_per_min"])
    schedules = [make_schedule(tenant_a, name=f"s{i}", next_run_at=now) for i in range(40)]
    lease_set = leases()
    config = materialize_config(window_s=180, batch_size=5)

    def work(i: int) -> Any:
        if i == 0:  # the materializer: batches until nothing is due
            total = 0
            while (batch := materialize_batch(leases=lease_set, now=timezone.now(),
                                              config=config)).schedules:  # fmt: skip
                total += batch.inserted
            return total
        schedule = schedules[i - 1] if i <= len(schedules) else None
        assert schedule is not None
        return api_a.patch(
            f"/api/v1/schedules/{schedule.id}", {"expression": "*/2 * * * *"}, format="json"
        )

    results = run_at_once(len(schedules) + 1, work)

    # then: every update succeeded and its receipt names exactly what it superseded
    assert isinstance(results[0], int) and results[0] > 0, results[0]
    for schedule, response in zip(schedules, results[1:], strict=True):
        assert response.status_code == 200, response.content
        receipt = response.json()["receipt"]
        superseded = Occurrence.objects.filter(schedule=schedule, state="SUPERSEDED")
        # An instant within the relay's clock slack of the change counts as maybe published
        # (`dropped_at_claim`): at hh:mm:59 the next minute's is.
        recalled = receipt["invalidated"] + receipt["dropped_at_claim"]
        assert sorted(recalled) == sorted(str(o.id) for o in superseded)
        assert receipt["not_recalled"] == []
        assert ScheduleVersion.objects.get(schedule=schedule, version=1).valid_to is not None
    # nothing of version 1 at or after its change is left to publish or pending. An instant
    # before the change is version 1's own: an update that comes after a minute's turn the
    # materializer had not reached yet produces that minute's instant as version 1, to be
    # published (docs/decisions.md "Lifecycle API"; CI runs at any second of a minute).
    changed_at = {
        schedule.id: datetime.fromisoformat(response.json()["receipt"]["at"])
        for schedule, response in zip(schedules, results[1:], strict=True)
    }

    def after_change(rows: Any) -> list[tuple[Any, datetime]]:
        return [
            (row.schedule_id, row.scheduled_for)
            for row in rows
            if row.scheduled_for >= changed_at[row.schedule_id]
        ]

    assert after_change(DispatchOutbox.objects.filter(schedule_version=1)) == []
    assert after_change(Occurrence.objects.filter(schedule_version=1, state="SCHEDULED")) == []
    # and the materializer resumes with version 2 only
    while materialize_batch(leases=lease_set, now=timezone.now(), config=config).schedules:
        pass
    assert after_change(DispatchOutbox.objects.exclude(schedule_version=2)) == []
    assert Occurrence.objects.filter(schedule_version=2).count() >= 1
