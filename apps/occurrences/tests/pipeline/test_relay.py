"""Relay against the real RabbitMQ: confirmed publish, then record; failures stay queued."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.occurrences.models import DispatchOutbox, Occurrence, ShardLease
from apps.occurrences.pipeline import relay
from apps.occurrences.pipeline.materializer import materialize_pass
from apps.occurrences.pipeline.queues import queue_name, tenant_partition
from apps.occurrences.pipeline.relay import OutboxRow, Recorder, build_messages, relay_step
from apps.occurrences.tests.support.pipeline import leases, materialize_config, relay_config
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule

pytestmark = pytest.mark.django_db


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


def _rows(tenants, at):
    return [
        OutboxRow(i, str(uuid.uuid4()), at, str(uuid.uuid4()), 1, tenant, "strict", at, 0)
        for i, tenant in enumerate(tenants)
    ]


def test_a_burst_travels_in_per_tenant_envelopes_and_tenants_take_turns(queue_prefix):
    at = datetime(2026, 12, 2, tzinfo=UTC)
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    rows = _rows([a, a, a, a, a, b, b], at)
    config = replace(relay_config(queue_prefix), envelope_max=2)

    [messages] = build_messages(rows, config)

    # a: 5 rows -> envelopes of 2, 2, 1; b: 2 rows -> one envelope; turns alternate.
    carried = [[rows[k].tenant_id for k in m.keys] for m in messages]
    assert carried == [[a, a], [b, b], [a, a], [a]]
    assert [m.task_name for m in messages] == [
        "tick.run_occurrences", "tick.run_occurrences", "tick.run_occurrences",
        "tick.run_occurrence",
    ]  # fmt: skip
    assert sorted(k for m in messages for k in m.keys) == list(range(7))
    envelope = messages[0].kwargs
    # Tenant and lane said once per envelope; each item is what a claim needs.
    assert (envelope["tenant_id"], envelope["lane"]) == (a, "strict")
    assert envelope["occurrences"] == [
        {"occurrence_id": row.occurrence_id, "scheduled_for": at.isoformat()} for row in rows[:2]
    ]


def test_rows_due_at_different_instants_are_published_in_instant_order(queue_prefix):
    t0 = datetime(2026, 12, 2, tzinfo=UTC)
    late = _rows([str(uuid.uuid4())], t0 + timedelta(seconds=1))
    early = _rows([str(uuid.uuid4())], t0)

    groups = build_messages(late + early, relay_config(queue_prefix))

    assert [g[0].kwargs["occurrence_id"] for g in groups] == [
        early[0].occurrence_id,
        late[0].occurrence_id,
    ]


def test_envelope_of_a_burst_reaches_the_queue_and_every_row_is_recorded(
    tenant_a, queue_prefix, publisher
):
    # given: three one-shots of one tenant due at the same instant
    run_at = timezone.now() - timedelta(seconds=1)
    for _ in range(3):
        make_schedule(
            tenant_a, kind=Schedule.Kind.ONE_SHOT, expression="", run_at=run_at,
            next_run_at=run_at,
        )  # fmt: skip
    materialize_pass(leases=leases(), now=timezone.now(), config=materialize_config())

    # when
    result = relay_step(
        leases=leases(ShardLease.Role.RELAY), publisher=publisher, config=relay_config(queue_prefix)
    )

    # then: one message carries all three; each occurrence has its own enqueued_at
    assert (result.published, result.messages) == (3, 1)
    assert set(Occurrence.objects.values_list("state", flat=True)) == {"ENQUEUED"}
    assert not DispatchOutbox.objects.exists()
    queue = queue_name(queue_prefix, "strict", tenant_partition(tenant_a.id, 4))
    message = publisher._channel.basic_get(queue, no_ack=True)
    assert message.headers["task"] == "tick.run_occurrences"
    _args, kwargs, _embed = json.loads(message.body)
    assert sorted(i["occurrence_id"] for i in kwargs["occurrences"]) == sorted(
        str(i) for i in Occurrence.objects.values_list("id", flat=True)
    )


@pytest.mark.django_db(transaction=True)  # the recorder thread has its own connection
def test_recorder_thread_records_and_the_next_step_skips_rows_in_flight(
    tenant_a, queue_prefix, publisher
):
    # given: one due occurrence, and a recorder that has not run yet
    _, occurrence = _due_one_shot(tenant_a)
    relay_leases = leases(ShardLease.Role.RELAY)
    recorder = Recorder(relay_leases)

    first = relay_step(
        leases=relay_leases, publisher=publisher, config=relay_config(queue_prefix),
        recorder=recorder,
    )  # fmt: skip
    # the row is confirmed but not recorded: a second step must not publish it again
    second = relay_step(
        leases=relay_leases, publisher=publisher, config=relay_config(queue_prefix),
        recorder=recorder,
    )  # fmt: skip
    assert (first.published, second.claimed) == (1, 0)
    assert DispatchOutbox.objects.count() == 1

    # when: the recorder runs
    recorder.start()
    recorder.stop()

    # then
    occurrence.refresh_from_db()
    assert occurrence.state == Occurrence.State.ENQUEUED
    assert DispatchOutbox.objects.count() == 0
    assert recorder.inflight_ids() == []


@pytest.mark.django_db(transaction=True)  # the recorder thread has its own connection
def test_a_big_batch_is_recorded_in_chunks_each_its_own_transaction(
    tenant_a, queue_prefix, publisher, monkeypatch, caplog
):
    # given: five rows published in one step, and chunks of two
    monkeypatch.setattr(relay, "RECORD_CHUNK_ROWS", 2)
    run_at = timezone.now() - timedelta(seconds=1)
    for _ in range(5):
        make_schedule(
            tenant_a, kind=Schedule.Kind.ONE_SHOT, expression="", run_at=run_at,
            next_run_at=run_at,
        )  # fmt: skip
    materialize_pass(leases=leases(), now=timezone.now(), config=materialize_config())
    relay_leases = leases(ShardLease.Role.RELAY)
    recorder = Recorder(relay_leases)
    relay_step(
        leases=relay_leases, publisher=publisher, config=relay_config(queue_prefix),
        recorder=recorder,
    )  # fmt: skip

    # when
    with caplog.at_level("INFO", logger=relay.__name__):
        recorder.start()
        recorder.stop()

    # then: three short transactions (each holds the shard fence only that long), all recorded
    recorded = [r.getMessage().split()[1] for r in caplog.records if "recorded" in r.getMessage()]
    assert recorded == ["2", "2", "1"]
    assert set(Occurrence.objects.values_list("state", flat=True)) == {Occurrence.State.ENQUEUED}
    assert not DispatchOutbox.objects.exists()


def test_a_poison_row_is_parked_after_bounded_tries_while_the_rest_keep_flowing(
    tenant_a, tenant_b, queue_prefix, publisher, monkeypatch
):
    # given: tenant A's due occurrence cannot be turned into a message; B's can
    _, poison = _due_one_shot(tenant_a)
    build = publisher._message

    def refuse_poison(out):
        if out.task_id == str(poison.id):
            raise ValueError("cannot serialise this payload")
        return build(out)

    monkeypatch.setattr(publisher, "_message", refuse_poison)
    relay_leases = leases(ShardLease.Role.RELAY)
    config = relay_config(queue_prefix)

    # when: the relay tries five times (each failure backs the row off; bring it due again)
    published = 0
    for attempt in range(5):
        if attempt == 2:
            _due_one_shot(tenant_b)  # a healthy row arrives behind the poison one
        DispatchOutbox.objects.update(available_at=timezone.now() - timedelta(seconds=1))
        published += relay_step(leases=relay_leases, publisher=publisher, config=config).published

    # then: the poison row is parked with its error and its occurrence is DEAD (in the DLQ);
    # the healthy one went through
    row = DispatchOutbox.objects.get(occurrence_id=poison.id)
    assert row.publish_attempts == 5 and row.parked_at is not None
    assert "cannot serialise this payload" in row.last_error
    poison.refresh_from_db()
    assert poison.state == Occurrence.State.DEAD
    assert published == 1
    assert Occurrence.objects.get(tenant=tenant_b).state == Occurrence.State.ENQUEUED
    # and a parked row is never read again
    assert relay_step(leases=relay_leases, publisher=publisher, config=config).claimed == 0


def test_a_failed_publish_backs_off_before_the_next_try(tenant_a, queue_prefix, publisher):
    _, occurrence = _due_one_shot(tenant_a)
    publisher._channel.queue_delete(
        queue_name(queue_prefix, "strict", tenant_partition(tenant_a.id, 4))
    )

    relay_step(
        leases=leases(ShardLease.Role.RELAY), publisher=publisher, config=relay_config(queue_prefix)
    )

    row = DispatchOutbox.objects.get(occurrence_id=occurrence.id)
    assert row.publish_attempts == 1 and row.parked_at is None
    assert "unroutable" in row.last_error
    assert row.available_at > timezone.now()


def test_a_flexible_row_read_at_its_available_at_asks_the_misfire_judge_nothing():
    # Its instant is two minutes old, but it is due only now (its place in the window).
    now = timezone.now()
    row = OutboxRow(
        1, str(uuid.uuid4()), now - timedelta(minutes=2), str(uuid.uuid4()), 1,
        str(uuid.uuid4()), "flexible", now, 0,
    )  # fmt: skip

    with CaptureQueriesContext(connection) as queries, connection.cursor() as cursor:
        kept = relay.judge_late_rows(cursor, [row], relay.RelayResult())

    assert kept == [row]
    assert len(queries) == 0
