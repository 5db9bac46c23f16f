"""The worker's claim and completion name the day partition of the row they change, and fall
back to the partitioned tables where that partition is missing or retention may drop it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from apps.occurrences.execution.claim import ClaimStatus, occurrence_claim
from apps.occurrences.execution.statements import (
    ATTEMPT_ROW_TABLE,
    OCCURRENCE_ROW_TABLE,
    on_row_partitions,
)
from apps.occurrences.pipeline.partitions import partitions_ensure, partitions_forget

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _forget_rolled_back_partitions():
    yield
    partitions_forget()  # the days these tests created go with their transaction


STATEMENT = f"SELECT 1 FROM {OCCURRENCE_ROW_TABLE} JOIN {ATTEMPT_ROW_TABLE} ON true"


def _named(at: datetime, now: datetime) -> str:
    return on_row_partitions(STATEMENT, at, now)


def test_a_row_of_a_kept_day_is_reached_through_its_partitions(settings):
    now = datetime(2031, 3, 10, 12, tzinfo=UTC)
    partitions_ensure([now.date()])

    assert _named(now - timedelta(hours=1), now) == (
        "SELECT 1 FROM occurrences_occurrence_p20310310 JOIN occurrences_attempt_p20310310 ON true"
    )


def test_a_day_without_partitions_or_near_retention_uses_the_partitioned_tables(settings):
    settings.TICK_RETENTION_DAYS = 3
    now = datetime(2031, 3, 10, 12, tzinfo=UTC)
    # Kept today (three days back), dropped by the pass of the next day.
    last_kept_day = now - timedelta(days=3)
    partitions_ensure([last_kept_day.date()])
    parents = "SELECT 1 FROM occurrences_occurrence JOIN occurrences_attempt ON true"

    assert _named(datetime(2031, 3, 20, 1, tzinfo=UTC), now) == parents  # never created
    assert _named(last_kept_day, now) == parents
    partitions_ensure([(now - timedelta(days=2)).date()])
    assert _named(now - timedelta(days=2), now).endswith("occurrences_attempt_p20310308 ON true")


def test_a_message_for_a_day_without_partitions_is_not_found(tenant_a):
    claim = occurrence_claim(
        occurrence_id=uuid.uuid4(),
        scheduled_for=timezone.now() + timedelta(days=400),
        worker_id="w1",
    )

    assert claim.status == ClaimStatus.NOT_FOUND
