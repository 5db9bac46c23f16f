"""Health at a glance on the schedule list (docs/ui.md "Health"): occurrences brought to their
states by the engine's own claim and completion, then read back on the page, through the
"failing" / "late" filters, and by the bounded scan those filters use."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.db.models import F

from apps.occurrences.execution.claim import ClaimStatus, occurrence_claim
from apps.occurrences.execution.complete import attempt_complete
from apps.occurrences.execution.handlers import PermanentError
from apps.occurrences.models import Occurrence
from apps.occurrences.schedule_health import (
    _HEALTH_SQL,
    HealthFilter,
    schedules_health,
    schedules_health_scan,
)
from apps.occurrences.tests.support.rows import occurrence, schedule
from apps.schedules.models import Schedule

pytestmark = [pytest.mark.django_db, pytest.mark.clock_edge]

NOW = datetime(2026, 12, 3, 9, 30, 20, tzinfo=UTC)


def _run(sched: Schedule, due: datetime, *, fail: bool = False, start_lag_s: int = 1) -> None:
    """One occurrence due at `due`, published, then claimed and completed by the engine."""
    occ = occurrence(sched, due, state=Occurrence.State.ENQUEUED)
    Occurrence.objects.filter(id=occ.id).update(enqueued_at=due)
    started = due + timedelta(seconds=start_lag_s)
    claim = occurrence_claim(
        occurrence_id=occ.id, scheduled_for=due, worker_id="test-worker", now=started
    )
    assert claim.status == ClaimStatus.CLAIMED
    error = PermanentError("HTTP 410 from the endpoint") if fail else None
    attempt_complete(claim=claim, error=error, now=started + timedelta(seconds=2))


def _row(page: str, name: str) -> str:
    """The text of the list row of schedule `name`, tags stripped, spaces collapsed."""
    row = re.search(
        # An admin's row opens with its select-many checkbox.
        rf"<tr data-schedule=[^>]*>\s*(?:<td><input [^>]*></td>)?\s*"
        rf"<td><a [^>]*>{re.escape(name)}</a>.*?</tr>",
        page,
        re.S,
    )
    assert row is not None, f"no row for {name}"
    return " ".join(re.sub(r"<[^>]+>", " ", row.group(0)).split())


def _names(page: str) -> set[str]:
    return set(
        re.findall(
            r"<tr data-schedule=[^>]*>\s*(?:<td><input [^>]*></td>)?\s*<td><a [^>]*>([^<]+)</a>",
            page,
        )
    )


@time_machine.travel(NOW, tick=False)
def test_the_list_shows_the_last_run_and_success_after_runs(client, alice, tenant_a):
    # given: a schedule that ran three times (the last one failed) and one that never ran
    hourly = schedule(tenant_a, name="hourly report")
    for hours_ago, fail in ((3, False), (2, False), (1, True)):
        _run(hourly, NOW.replace(minute=0, second=0) - timedelta(hours=hours_ago - 1), fail=fail)
    schedule(tenant_a, name="brand new")
    client.force_login(alice)

    # when
    page = client.get("/schedules/").content.decode()

    # then: the last run is the DEAD one, the last success the run before, 2 of 3 succeeded
    row = _row(page, "hourly report")
    assert "failing" in row
    assert "Dead 30 min ago" in row  # finished at 09:00:03, now 09:30:20
    assert "1 h ago" in row  # the success that finished at 08:00:03
    assert "67% of 3" in row
    assert "Every hour" in row  # the rule in words
    fresh = _row(page, "brand new")
    assert "new" in fresh and "no run in 7 days" not in fresh and "failing" not in fresh


@time_machine.travel(NOW, tick=False)
def test_failing_filter_lists_schedules_whose_last_run_failed_or_rate_is_low(
    client, alice, tenant_a
):
    top = NOW.replace(minute=0, second=0)
    last_failed = schedule(tenant_a, name="last failed")
    _run(last_failed, top - timedelta(hours=1))
    _run(last_failed, top, fail=True)
    low_rate = schedule(tenant_a, name="low rate")  # 7 of 10 succeeded, the last one did
    for i in range(10):
        _run(low_rate, top - timedelta(hours=9 - i), fail=i in (1, 4, 6))
    healthy = schedule(tenant_a, name="healthy")  # 9 of 10 succeeded, the last one did
    for i in range(10):
        _run(healthy, top - timedelta(hours=9 - i), fail=i == 2)
    client.force_login(alice)

    page = client.get("/schedules/?health=failing").content.decode()

    assert _names(page) == {"last failed", "low rate"}
    assert "70% of 10" in _row(page, "low rate")
    assert "Searched 3 schedules" in page
    assert "healthy" in _names(client.get("/schedules/").content.decode())


@time_machine.travel(NOW, tick=False)
def test_late_filter_lists_overdue_and_late_started_schedules(client, alice, tenant_a):
    overdue = schedule(tenant_a, name="overdue")  # published 5 min ago, never started
    stuck = occurrence(overdue, NOW - timedelta(minutes=5), state=Occurrence.State.ENQUEUED)
    Occurrence.objects.filter(id=stuck.id).update(enqueued_at=NOW - timedelta(minutes=5))
    slow_start = schedule(tenant_a, name="slow start")  # started 2 min after it was due
    _run(slow_start, NOW - timedelta(minutes=10), start_lag_s=120)
    on_time = schedule(tenant_a, name="on time")
    _run(on_time, NOW - timedelta(minutes=10), start_lag_s=2)
    just_due = schedule(tenant_a, name="just due")  # due 20 s ago: within the threshold
    occurrence(just_due, NOW - timedelta(seconds=20), state=Occurrence.State.ENQUEUED)
    long_ago = schedule(tenant_a, name="long ago")  # late, but two hours ago
    _run(long_ago, NOW - timedelta(hours=2), start_lag_s=300)
    client.force_login(alice)

    page = client.get("/schedules/?health=late").content.decode()

    assert _names(page) == {"overdue", "slow start"}
    assert "late" in _row(page, "overdue")


@time_machine.travel(NOW, tick=False)
def test_health_of_a_page_is_one_query_whatever_the_number_of_schedules(
    tenant_a, django_assert_num_queries
):
    schedules = [schedule(tenant_a, name=f"s{i}") for i in range(12)]
    for sched in schedules[:6]:
        _run(sched, NOW.replace(minute=0, second=0), fail=sched.name == "s3")

    with django_assert_num_queries(1):
        health = schedules_health(schedules, now=NOW)

    assert sum(h.failing for h in health.values()) == 1
    assert [health[s.id].success_rate for s in schedules[:3]] == [1.0, 1.0, 1.0]
    assert health[schedules[7].id].success_rate is None


@time_machine.travel(NOW, tick=False)
def test_filter_scan_stops_at_its_budget_and_resumes_where_it_stopped(tenant_a):
    created = [schedule(tenant_a, name=f"s{i}") for i in range(7)]
    for i, sched in enumerate(created):  # oldest first (the clock stands still here)
        Schedule.objects.filter(pk=sched.pk).update(
            created_at=NOW - timedelta(minutes=10 - i), version=F("version")
        )
        sched.refresh_from_db()
    for sched in created[:2]:  # only the two oldest are failing
        _run(sched, NOW.replace(minute=0, second=0), fail=True)
    queryset = Schedule.objects.filter(tenant=tenant_a)

    first = schedules_health_scan(
        queryset, want=HealthFilter.FAILING, after=None, size=25, now=NOW, budget=4, batch=3
    )
    second = schedules_health_scan(
        queryset, want=HealthFilter.FAILING, after=first.resume_after, size=25, now=NOW,
        budget=4, batch=3,
    )  # fmt: skip

    assert (first.rows, first.scanned) == ([], 4)
    assert first.resume_after == (created[3].created_at, created[3].id)
    assert [s.name for s, _ in second.rows] == ["s1", "s0"]
    assert (second.scanned, second.resume_after) == (3, None)


@time_machine.travel(NOW, tick=False)
def test_the_health_query_reads_the_schedule_time_index_on_the_partitions(tenant_a):
    sched = schedule(tenant_a, name="indexed")
    _run(sched, NOW.replace(minute=0, second=0))
    params = {
        "ids": [sched.id], "tenant": tenant_a.id, "now": NOW, "since": NOW - timedelta(days=7),
        "run": ["SUCCEEDED"], "finished": ["SUCCEEDED"], "succeeded": "SUCCEEDED",
        "rate_over": 20, "from_available": ["flexible"], "late_since": NOW - timedelta(hours=1),
        "late_lookback": 10, "not_started": ["ENQUEUED"], "late_before": NOW,
        "late_after": timedelta(seconds=60), "timetable": "scheduled",
    }  # fmt: skip
    with connection.cursor() as cursor:
        # Tiny test tables make a sequential scan cheapest; forbid it to see which index the
        # planner has for the probes (on a real table it prefers the index by itself).
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + _HEALTH_SQL, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())

    occurrence_scans = re.findall(
        r"Scan(?: Backward)? using (\S+) on occurrences_occurrence_\w+", plan
    )
    assert occurrence_scans, plan
    assert all("schedule_id_scheduled_for" in name for name in occurrence_scans), plan
    assert "Seq Scan on occurrences_occurrence" not in plan
