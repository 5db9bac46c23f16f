"""Relay against the real RabbitMQ: confirmed publish, then record; failures stay queued."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from apps.occurrences.broker import Publisher
from apps.occurrences.materializer import materialize_pass
from apps.occurrences.models import DispatchOutbox, Occurrence, ShardLease
from apps.occurrences.queues import queue_name, tenant_partition
from apps.occurrences.relay import relay_step
from apps.occurrences.tests.helpers import leases, materialize_config, relay_config
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule
from tickweb.celery import app as celery_app

pytestmark = pytest.mark.django_db


@pytest.fixture
def publisher(queue_prefix):
    pub = Publisher(
        settings.CELERY_BROKER_URL,
        prefix=queue_prefix,
        partitions=settings.TICK_TENANT_PARTITIONS,
        celery_app=celery_app,
    )
    pub.connect()
    yield pub
    pub.close()


def _due_one_shot(tenant):
    run_at = timezone.now() - timedelta(seconds=1)
    schedule = make_schedule(
        tenant, kind=Schedule.Kind.ONE_SHOT, expression="", run_at=run_at, next_run_at=run_at
    )
    materialize_pass(leases=leases(), now=timezone.now(), config=materialize_config())
    return schedule, Occurrence.objects.get(schedule=schedule)


def test_confirmed_publish_records_enqueued_at_and_empties_the_outbox(
    tenant_a, queue_prefix, publisher
):
    schedule, occurrence = _due_one_shot(tenant_a)

    result = relay_step(
        leases=leases(ShardLease.Role.RELAY), publisher=publisher, config=relay_config(queue_prefix)
    )

    assert (result.claimed, result.published, result.failed) == (1, 1, 0)
    occurrence.refresh_from_db()
    assert occurrence.state == Occurrence.State.ENQUEUED
    assert occurrence.enqueued_at is not None
    assert occurrence.enqueued_at >= occurrence.scheduled_for
    assert DispatchOutbox.objects.count() == 0
    # The message is a Celery task message in the tenant's strict queue.
    queue = queue_name(queue_prefix, "strict", tenant_partition(tenant_a.id, 4))
    message = publisher._channel.basic_get(queue, no_ack=True)
    assert message is not None
    assert message.headers["task"] == "tick.run_occurrence"
    assert message.headers["id"] == str(occurrence.id)
    assert message.properties["delivery_mode"] == 2
    args, kwargs, _embed = json.loads(message.body)
    assert kwargs["occurrence_id"] == str(occurrence.id)
    assert kwargs["schedule_id"] == str(schedule.id)


def test_unroutable_publish_is_a_failure_and_the_row_stays(tenant_a, queue_prefix, publisher):
    _, occurrence = _due_one_shot(tenant_a)
    # The queue vanished (operator error): mandatory publish comes back unroutable.
    publisher._channel.queue_delete(
        queue_name(queue_prefix, "strict", tenant_partition(tenant_a.id, 4))
    )

    result = relay_step(
        leases=leases(ShardLease.Role.RELAY), publisher=publisher, config=relay_config(queue_prefix)
    )

    assert (result.published, result.failed) == (0, 1)
    occurrence.refresh_from_db()
    assert occurrence.state == Occurrence.State.SCHEDULED
    assert occurrence.enqueued_at is None
    assert DispatchOutbox.objects.filter(occurrence_id=occurrence.id).count() == 1


def test_rows_not_yet_available_are_not_published_early(tenant_a, queue_prefix, publisher):
    run_at = timezone.now() + timedelta(seconds=30)
    make_schedule(
        tenant_a, kind=Schedule.Kind.ONE_SHOT, expression="", run_at=run_at, next_run_at=run_at
    )
    materialize_pass(leases=leases(), now=timezone.now(), config=materialize_config())

    result = relay_step(
        leases=leases(ShardLease.Role.RELAY), publisher=publisher, config=relay_config(queue_prefix)
    )

    assert result.claimed == 0
    assert DispatchOutbox.objects.count() == 1
    assert Occurrence.objects.get().state == Occurrence.State.SCHEDULED


def test_tenants_are_interleaved_within_an_instant():
    import uuid
    from datetime import UTC, datetime

    from apps.occurrences.relay import _OutboxRow, interleave_tenants

    at = datetime(2026, 12, 2, tzinfo=UTC)
    a, b = uuid.uuid4(), uuid.uuid4()
    rows = [
        _OutboxRow(i, uuid.uuid4(), at, uuid.uuid4(), 1, tenant, "strict", at)
        for i, tenant in enumerate([a, a, a, a, b, b])
    ]

    ordered = [row.tenant_id for row in interleave_tenants(rows)]

    assert ordered == [a, b, a, b, a, a]
