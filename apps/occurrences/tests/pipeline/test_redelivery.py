"""The backstop (redelivery.occurrences_redeliver): ENQUEUED work the broker lost is
republished with the same id; everything else is left alone. Real PostgreSQL; one test
through the real RabbitMQ and the relay."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client import REGISTRY

from apps.occurrences.execution.run import occurrence_execute
from apps.occurrences.models import Attempt, DispatchOutbox, Lane, Occurrence, ShardLease
from apps.occurrences.pipeline.materializer import materialize_pass
from apps.occurrences.pipeline.queues import queue_name, tenant_partition
from apps.occurrences.pipeline.redelivery import occurrences_redeliver
from apps.occurrences.pipeline.relay import relay_step
from apps.occurrences.tests.support.pipeline import leases, materialize_config, relay_config
from apps.occurrences.tests.support.rows import occurrence, schedule
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule

pytestmark = [pytest.mark.django_db, pytest.mark.clock_edge]

AFTER_S = 600


def _enqueued(tenant, *, minutes_ago, last_minutes_ago=None, sched=None, state=None):
    """An occurrence first confirmed `minutes_ago`, last confirmed `last_minutes_ago`."""
    now = timezone.now()
    at = now - timedelta(minutes=minutes_ago)
    occ = occurrence(sched or schedule(tenant), at, state=state or Occurrence.State.ENQUEUED)
    last = now - timedelta(minutes=minutes_ago if last_minutes_ago is None else last_minutes_ago)
    Occurrence.objects.filter(id=occ.id).update(enqueued_at=at, last_enqueued_at=last)
    occ.refresh_from_db()
    return occ


def _open_attempt(occ):
    now = timezone.now()
    Attempt.objects.create(
        scheduled_for=occ.scheduled_for, occurrence_id=occ.id, tenant_id=occ.tenant_id,
        attempt_no=1, lease_token=uuid.uuid4(), lease_expires_at=now + timedelta(seconds=60),
        worker_id="w", started_at=now,
    )  # fmt: skip


def _outbox_row(occ, **fields):
    values = {
        "occurrence_id": occ.id, "scheduled_for": occ.scheduled_for,
        "schedule_id": occ.schedule_id, "schedule_version": occ.schedule_version,
        "tenant_id": occ.tenant_id, "shard": occ.schedule.shard, "lane": Lane.RETRY,
        "available_at": timezone.now() + timedelta(seconds=30), "created_at": timezone.now(),
    }  # fmt: skip
    values.update(fields)
    return DispatchOutbox.objects.create(**values)


def _counter() -> float:
    return REGISTRY.get_sample_value("tick_backstop_redeliveries_total") or 0.0


def test_enqueued_past_the_bound_with_no_attempt_gets_one_outbox_row_with_the_same_id(tenant_a):
    occ = _enqueued(tenant_a, minutes_ago=15)
    before = _counter()
    now = timezone.now()

    result = occurrences_redeliver(now=now, after_s=AFTER_S)

    assert result.republished == 1
    assert _counter() - before == 1
    row = DispatchOutbox.objects.get()
    assert (row.occurrence_id, row.scheduled_for) == (occ.id, occ.scheduled_for)
    assert (row.lane, row.available_at, row.shard) == (Lane.RETRY, now, occ.schedule.shard)
    assert (row.schedule_id, row.schedule_version, row.tenant_id) == (
        occ.schedule_id, occ.schedule_version, occ.tenant_id
    )  # fmt: skip
    occ.refresh_from_db()
    assert occ.state == Occurrence.State.ENQUEUED
    assert (occ.redelivery_count, occ.last_redelivered_at) == (1, now)


def test_a_second_pass_adds_nothing_while_the_republish_waits_in_the_outbox(tenant_a):
    occ = _enqueued(tenant_a, minutes_ago=15)
    occurrences_redeliver(now=timezone.now(), after_s=AFTER_S)

    again = occurrences_redeliver(now=timezone.now() + timedelta(seconds=1), after_s=AFTER_S)

    assert again.republished == 0
    assert DispatchOutbox.objects.count() == 1
    occ.refresh_from_db()
    assert occ.redelivery_count == 1


def test_recent_claimed_retried_and_finished_occurrences_are_left_alone(tenant_a):
    within_bound = _enqueued(tenant_a, minutes_ago=5)
    enqueued_with_open_attempt = _enqueued(tenant_a, minutes_ago=15)
    _open_attempt(enqueued_with_open_attempt)
    running = _enqueued(tenant_a, minutes_ago=15, state=Occurrence.State.RUNNING)
    _open_attempt(running)
    succeeded = _enqueued(tenant_a, minutes_ago=15, state=Occurrence.State.SUCCEEDED)
    # First confirmed long ago, but its retry (or a quota delay) was confirmed a minute ago:
    # its message is in the queue, not lost.
    republished_recently = _enqueued(tenant_a, minutes_ago=30, last_minutes_ago=1)

    result = occurrences_redeliver(now=timezone.now(), after_s=AFTER_S)

    assert result.republished == 0
    assert DispatchOutbox.objects.count() == 0
    untouched = [within_bound, enqueued_with_open_attempt, running, succeeded,
                 republished_recently]  # fmt: skip
    counts = Occurrence.objects.filter(id__in=[o.id for o in untouched]).values_list(
        "redelivery_count", flat=True
    )
    assert list(counts) == [0] * 5


def test_the_limit_is_honoured_oldest_first(tenant_a):
    sched = schedule(tenant_a)
    oldest, middle, newest = (_enqueued(tenant_a, minutes_ago=m, sched=sched) for m in (40, 30, 20))

    first = occurrences_redeliver(now=timezone.now(), after_s=AFTER_S, limit=2)

    assert first.republished == 2
    assert set(DispatchOutbox.objects.values_list("occurrence_id", flat=True)) == {
        oldest.id, middle.id
    }  # fmt: skip
    second = occurrences_redeliver(now=timezone.now(), after_s=AFTER_S, limit=2)
    assert second.republished == 1
    assert DispatchOutbox.objects.filter(occurrence_id=newest.id).count() == 1


def test_another_occurrences_outbox_row_does_not_suppress_it(tenant_a):
    sched = schedule(tenant_a)
    lost = _enqueued(tenant_a, minutes_ago=20, sched=sched)
    other = _enqueued(tenant_a, minutes_ago=25, sched=sched, state=Occurrence.State.RETRY_WAIT)
    _outbox_row(other)  # same schedule, same shard: only the occurrence key tells them apart

    result = occurrences_redeliver(now=timezone.now(), after_s=AFTER_S)

    assert result.republished == 1
    assert DispatchOutbox.objects.filter(occurrence_id=lost.id).count() == 1


def test_a_parked_row_is_not_pending_so_the_backstop_tries_again(tenant_a):
    # An earlier republish failed until the relay parked it (e.g. a broker alarm): the
    # relay never retries a parked row, so the backstop publishes a fresh one.
    occ = _enqueued(tenant_a, minutes_ago=20)
    _outbox_row(occ, parked_at=timezone.now(), publish_attempts=5, last_error="nacked")

    result = occurrences_redeliver(now=timezone.now(), after_s=AFTER_S)

    assert result.republished == 1
    assert DispatchOutbox.objects.filter(occurrence_id=occ.id, parked_at=None).count() == 1


def test_only_the_lookback_is_scanned(tenant_a):
    old = _enqueued(tenant_a, minutes_ago=3 * 60)

    narrow = occurrences_redeliver(now=timezone.now(), after_s=AFTER_S, lookback_s=3600)
    wide = occurrences_redeliver(now=timezone.now(), after_s=AFTER_S, lookback_s=4 * 3600)

    assert (narrow.republished, wide.republished) == (0, 1)
    assert DispatchOutbox.objects.get().occurrence_id == old.id


def test_the_deep_pass_reaches_instants_older_than_the_lookback(tenant_a):
    # A backfilled instant of three days ago, published and then lost: its instant is far
    # outside the day of instants each pass reads.
    backfilled = _enqueued(tenant_a, minutes_ago=3 * 24 * 60, last_minutes_ago=20)

    usual = occurrences_redeliver(now=timezone.now(), after_s=AFTER_S)
    deep = occurrences_redeliver(now=timezone.now(), after_s=AFTER_S, deep=True)

    assert (usual.republished, deep.republished) == (0, 1)
    assert DispatchOutbox.objects.get().occurrence_id == backfilled.id


def test_a_waiting_occurrence_whose_recheck_message_was_lost_is_republished(tenant_a):
    # QUEUE_ONE: parked WAITING behind a long run, its re-check confirmed 20 minutes ago and
    # never claimed (the message was lost), no re-check row pending.
    sched = schedule(tenant_a, overlap_policy=Schedule.OverlapPolicy.QUEUE_ONE)
    lost = _enqueued(tenant_a, minutes_ago=25, last_minutes_ago=20, sched=sched,
                     state=Occurrence.State.WAITING)  # fmt: skip
    # one whose re-check chain is alive (confirmed a moment ago) is left alone
    alive = _enqueued(tenant_a, minutes_ago=25, last_minutes_ago=0, sched=sched,
                      state=Occurrence.State.WAITING)  # fmt: skip

    result = occurrences_redeliver(now=timezone.now(), after_s=AFTER_S)

    assert result.republished == 1
    assert DispatchOutbox.objects.get().occurrence_id == lost.id
    assert Occurrence.objects.get(id=alive.id).redelivery_count == 0


def test_api_web_page_and_admin_show_the_redelivery(api_a, client, alice, admin_client, tenant_a):
    occ = _enqueued(tenant_a, minutes_ago=15)
    now = timezone.now()
    occurrences_redeliver(now=now, after_s=AFTER_S)

    detail = api_a.get(f"/api/v1/occurrences/{occ.id}").json()
    listed = api_a.get("/api/v1/occurrences").json()["results"]
    client.force_login(alice)
    page = client.get(f"/occurrences/{occ.id}/").content.decode()
    admin_page = admin_client.get(f"/admin/occurrences/browse/{occ.id}/").content.decode()

    assert detail["redelivery_count"] == 1
    assert detail["last_redelivered_at"] == now.isoformat().replace("+00:00", "Z")
    assert detail["last_enqueued_at"] is not None
    assert [(o["id"], o["redelivery_count"]) for o in listed] == [(str(occ.id), 1)]
    assert "by the backstop 1×" in page
    assert "Redelivered by the backstop" in admin_page and "1×" in admin_page


def test_republished_row_reaches_the_broker_with_the_same_id_and_is_claimed_normally(
    tenant_a, queue_prefix, publisher
):
    # given: an occurrence published and recorded by the relay, whose message is then lost
    run_at = timezone.now() - timedelta(seconds=1)
    make_schedule(
        tenant_a, kind=Schedule.Kind.ONE_SHOT, expression="", run_at=run_at, next_run_at=run_at
    )
    materialize_pass(leases=leases(), now=timezone.now(), config=materialize_config())
    relay_leases, config = leases(ShardLease.Role.RELAY), relay_config(queue_prefix)
    assert relay_step(leases=relay_leases, publisher=publisher, config=config).published == 1
    occ = Occurrence.objects.get()
    first_confirm = occ.enqueued_at
    assert first_confirm is not None and occ.last_enqueued_at == first_confirm
    partition = tenant_partition(tenant_a.id, config.partitions)
    strict = queue_name(queue_prefix, "strict", partition)
    assert publisher._channel.basic_get(strict, no_ack=True) is not None  # the broker loses it

    # when: the backstop finds it (bound 0 s: anything confirmed before now) and the relay runs
    assert occurrences_redeliver(now=timezone.now(), after_s=0).republished == 1
    result = relay_step(leases=relay_leases, publisher=publisher, config=config)

    # then: the same occurrence id on the retry lane; ENQUEUED again with a new last confirm,
    # the first confirm (the SLO's) kept; the outbox is empty
    assert result.published == 1
    message = publisher._channel.basic_get(queue_name(queue_prefix, "retry", partition),
                                           no_ack=True)  # fmt: skip
    assert message is not None
    assert message.headers["id"] == str(occ.id)
    _args, kwargs, _embed = json.loads(message.body)
    assert kwargs["occurrence_id"] == str(occ.id)
    occ.refresh_from_db()
    assert occ.state == Occurrence.State.ENQUEUED and occ.redelivery_count == 1
    assert occ.enqueued_at == first_confirm
    assert occ.last_enqueued_at is not None and occ.last_enqueued_at > first_confirm
    assert DispatchOutbox.objects.count() == 0
    # not republished again before the bound passes once more
    later = occ.last_enqueued_at + timedelta(seconds=AFTER_S - 1)
    assert occurrences_redeliver(now=later, after_s=AFTER_S).republished == 0

    # and a worker receiving it claims and runs it like any delivery
    summary = occurrence_execute(
        occurrence_id=uuid.UUID(kwargs["occurrence_id"]),
        scheduled_for=occ.scheduled_for,
        worker_id="w-redelivered",
    )
    assert summary == {"status": "SUCCEEDED", "attempt_no": 1}
    assert Occurrence.objects.get().state == Occurrence.State.SUCCEEDED
