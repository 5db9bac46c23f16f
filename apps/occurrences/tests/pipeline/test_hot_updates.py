"""Recording a publish and claiming change no indexed column of an occurrence, and its
partitions keep free space in each page, so both are HOT updates: no new index entries,
less WAL per occurrence (docs/decisions.md "PostgreSQL work per occurrence")."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from apps.occurrences.models import Occurrence
from apps.occurrences.pipeline import relay
from apps.occurrences.pipeline.partitions import partition_name
from apps.occurrences.tests.support.rows import occurrence, schedule
from apps.tenants.services import tenant_create


def _hot_and_all_updates(partition: str) -> tuple[int, int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT 1")
        cursor.execute(
            "SELECT n_tup_hot_upd, n_tup_upd FROM pg_stat_user_tables WHERE relid = %s::regclass",
            [partition],
        )
        row = cursor.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@pytest.mark.django_db(transaction=True)
def test_recording_and_claiming_are_hot_updates():
    tenant = tenant_create(slug="hot-updates")
    sched = schedule(tenant)
    # An hour's instants in tomorrow's partition, which this test's rows alone touch.
    base = (timezone.now() + timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
    rows = [
        occurrence(sched, base + timedelta(minutes=n), state=Occurrence.State.SCHEDULED)
        for n in range(20)
    ]
    partition = partition_name("occurrences_occurrence", base.date())
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE oid = %s::regclass", [partition])
        options = cursor.fetchone()
    assert options is not None and "fillfactor=50" in (options[0] or [])
    hot_before, all_before = _hot_and_all_updates(partition)
    confirmed = timezone.now()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(relay._RECORD, {
            "outbox_ids": [0] * len(rows), "occurrence_ids": [r.id for r in rows],
            "scheduled_fors": [r.scheduled_for for r in rows],
            "confirmed_ats": [confirmed] * len(rows), "scheduled": Occurrence.State.SCHEDULED,
            "retry_wait": Occurrence.State.RETRY_WAIT, "enqueued": Occurrence.State.ENQUEUED,
        })  # fmt: skip
    for row in rows[:5]:  # a claim's change of the occurrence, one transaction each
        Occurrence.objects.filter(id=row.id, scheduled_for=row.scheduled_for).update(
            state=Occurrence.State.RUNNING, attempt_count=1
        )
    hot_after, all_after = _hot_and_all_updates(partition)
    assert all_after - all_before == 25
    assert hot_after - hot_before == 25
    assert Occurrence.objects.filter(state=Occurrence.State.ENQUEUED).count() == 15
