"""The worker's per-occurrence statements are prepared on a direct connection, and never on
one whose prepared statements are off (behind a transaction-mode pooler)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from apps.occurrences.execution.run import occurrence_execute
from apps.occurrences.models import Attempt, Occurrence
from apps.occurrences.tests.support.rows import occurrence, schedule

pytestmark = pytest.mark.django_db


def _prepared_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def _plans() -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT sum(generic_plans), sum(custom_plans) FROM pg_prepared_statements")
        generic, custom = cursor.fetchone()
    return {"generic": int(generic or 0), "custom": int(custom or 0)}


@pytest.fixture
def fresh_connection() -> Iterator[None]:
    # A session of its own: statements prepared by earlier tests are gone.
    connection.close()
    yield
    connection.close()


@pytest.fixture
def pooled(fresh_connection: None) -> Iterator[None]:
    """What DATABASE_POOLER=transaction sets (tickweb/settings.py)."""
    options = connection.settings_dict["OPTIONS"]
    saved = options.get("prepare_threshold")
    options["prepare_threshold"] = None
    yield
    connection.close()
    options["prepare_threshold"] = saved


def _run_two(tenant) -> list[Occurrence]:
    sched = schedule(tenant, handler="noop", payload={})
    at = timezone.now().replace(second=0, microsecond=0)
    if (at - timedelta(minutes=2)).date() != at.date():
        at = at.replace(hour=0, minute=0) - timedelta(minutes=1)  # both in one day's partitions
    occs = [occurrence(sched, at - timedelta(minutes=n)) for n in (1, 2)]
    for occ in occs:
        summary = occurrence_execute(
            occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w1"
        )
        assert summary == {"status": "SUCCEEDED", "attempt_no": 1}
    return occs


@pytest.mark.django_db(transaction=True)
def test_claim_and_completion_are_prepared_once_per_connection(tenant_a, fresh_connection):
    occs = _run_two(tenant_a)

    statements = _prepared_statements()
    # the row lock, the attempt's opening and the completion: one prepared statement each,
    # reused by the second occurrence, naming the day's partitions
    day = f"{occs[0].scheduled_for:%Y%m%d}"
    assert all(f"occurrences_occurrence_p{day}" in s for s in statements), statements
    assert sum("WITH r AS MATERIALIZED" in s for s in statements) == 1
    assert sum("WITH running AS" in s for s in statements) == 1
    assert sum("WITH held AS MATERIALIZED" in s for s in statements) == 1
    assert len(statements) == 3
    # ... and planned once: the second run reused the first one's generic plan
    assert _plans() == {"generic": 6, "custom": 0}
    for occ in occs:
        occ.refresh_from_db()
        assert (occ.state, occ.attempt_count) == (Occurrence.State.SUCCEEDED, 1)
        attempt = Attempt.objects.get(occurrence_id=occ.id)
        assert attempt.outcome == Attempt.Outcome.SUCCEEDED and attempt.finished_at is not None


@pytest.mark.django_db(transaction=True)
def test_nothing_is_prepared_when_prepared_statements_are_off(tenant_a, pooled):
    occs = _run_two(tenant_a)

    assert _prepared_statements() == []
    assert (
        sorted(o.state for o in Occurrence.objects.filter(id__in=[o.id for o in occs]))
        == [Occurrence.State.SUCCEEDED] * 2
    )
