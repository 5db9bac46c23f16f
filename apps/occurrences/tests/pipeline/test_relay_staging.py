"""Staging a big instant ahead of time (pipeline/staging.py): published at its instant, never
before; a recall between the early read and the instant is honoured; rows that arrive late
or beyond the memory bound go out with the next normal step."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from apps.occurrences.models import DispatchOutbox, Occurrence, ShardLease
from apps.occurrences.pipeline.leases import relay_shard_barrier
from apps.occurrences.pipeline.materializer import materialize_pass
from apps.occurrences.pipeline.queues import all_queue_names
from apps.occurrences.pipeline.relay import Recorder, relay_step, round_robin
from apps.occurrences.pipeline.staging import StageConfig, Stager
from apps.occurrences.schedule_changes import schedule_pause
from apps.occurrences.tests.support.pipeline import leases, materialize_config, relay_config
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule

pytestmark = pytest.mark.django_db

LEAD_S = 4.0


def _one_shots(tenant, count: int, at: datetime) -> list[Schedule]:
    schedules = [
        make_schedule(tenant, kind=Schedule.Kind.ONE_SHOT, expression="", run_at=at, next_run_at=at)
        for _ in range(count)
    ]
    materialize_pass(leases=leases(), now=timezone.now(), config=materialize_config())
    return schedules


def _stager(publisher, queue_prefix, **overrides) -> Stager:
    values: dict[str, Any] = {"min_rows": 3, "chunk_rows": 2, "horizon_s": 30.0, "max_rows": 1000,
              "probe_every_s": 0.0, "stop_before_s": 0.5, "publish_lead_s": 0.5}  # fmt: skip
    values.update(overrides)
    return Stager(
        leases=leases(ShardLease.Role.RELAY),
        publisher=publisher,
        relay_config=relay_config(queue_prefix),
        config=StageConfig(**values),
    )


def _stage_all(stager: Stager) -> int:
    staged = 0
    while added := stager.advance():
        staged += added
    return staged


def _publish_when_due(stager: Stager):
    while not stager.publish_due():
        time.sleep(0.05)
    return stager.publish()


def _queued_ids(publisher, prefix: str) -> list[str]:
    ids: list[str] = []
    for queue in all_queue_names(prefix, 4):
        while (message := publisher._channel.basic_get(queue, no_ack=True)) is not None:
            _args, kwargs, _embed = json.loads(message.body)
            ids.extend(item["occurrence_id"] for item in kwargs.get("occurrences") or [kwargs])
    return ids


def test_a_big_instant_is_read_in_chunks_ahead_and_published_at_its_instant(
    tenant_a, queue_prefix, publisher
):
    at = timezone.now() + timedelta(seconds=LEAD_S)
    _one_shots(tenant_a, 5, at)
    stager = _stager(publisher, queue_prefix)

    # Read ahead in chunks of 2, before the instant; nothing is published yet.
    assert _stage_all(stager) == 5
    assert stager.instant == at
    assert DispatchOutbox.objects.count() == 5
    # The normal step leaves the staged instant alone (and so never sleeps past it).
    step = relay_step(
        leases=stager.leases, publisher=publisher, config=relay_config(queue_prefix),
        before=stager.instant,
    )  # fmt: skip
    assert step.claimed == 0

    result = _publish_when_due(stager)

    assert result.published == 5
    occurrences = list(Occurrence.objects.all())
    assert {o.state for o in occurrences} == {Occurrence.State.ENQUEUED}
    # never early
    assert all(o.enqueued_at and o.enqueued_at >= o.scheduled_for for o in occurrences)
    assert not DispatchOutbox.objects.exists()
    assert sorted(_queued_ids(publisher, queue_prefix)) == sorted(str(o.id) for o in occurrences)
    assert stager.instant is None


def _recall(schedule: Schedule) -> None:
    """What a schedule change (update, pause, cancel) does to a not-yet-published row
    (schedule_changes._recall): the shard's relay barrier, then the delete."""
    with transaction.atomic():
        relay_shard_barrier(schedule.shard)
        DispatchOutbox.objects.filter(schedule_id=schedule.id).delete()
        Occurrence.objects.filter(schedule=schedule).update(state=Occurrence.State.CANCELED)


def test_a_row_recalled_after_it_was_staged_is_not_published(tenant_a, queue_prefix, publisher):
    at = timezone.now() + timedelta(seconds=LEAD_S)
    schedules = _one_shots(tenant_a, 4, at)
    stager = _stager(publisher, queue_prefix)
    assert _stage_all(stager) == 4

    # A schedule change between the early read and the instant recalls one row.
    paused = schedules[0]
    _recall(paused)
    _publish_when_due(stager)
    # The paused schedule's shard was dropped from the staged rows; the normal step reads
    # what is left of that shard afresh.
    relay_step(leases=stager.leases, publisher=publisher, config=relay_config(queue_prefix))

    recalled = Occurrence.objects.get(schedule=paused)
    assert recalled.state == Occurrence.State.CANCELED
    queued = _queued_ids(publisher, queue_prefix)
    assert str(recalled.id) not in queued
    others = Occurrence.objects.exclude(schedule=paused)
    assert sorted(queued) == sorted(str(o.id) for o in others)
    assert {o.state for o in others} == {Occurrence.State.ENQUEUED}


def test_a_pause_with_nothing_to_recall_keeps_the_staged_rows(tenant_a, queue_prefix, publisher):
    at = timezone.now() + timedelta(seconds=LEAD_S)
    staged = _one_shots(tenant_a, 4, at)
    stager = _stager(publisher, queue_prefix)
    assert _stage_all(stager) == 4
    recalls = dict(ShardLease.objects.values_list("shard", "recalls"))

    # A bulk pause of schedules with nothing materialized, on the staged rows' shards.
    for schedule in staged:
        idle = make_schedule(tenant_a, next_run_at=at + timedelta(days=365))
        Schedule.objects.filter(pk=idle.pk).update(shard=schedule.shard)
        idle.refresh_from_db()
        schedule_pause(schedule=idle, actor="test")

    # No barrier was taken (nothing counted), so every staged row goes out at the instant.
    assert dict(ShardLease.objects.values_list("shard", "recalls")) == recalls
    assert _publish_when_due(stager).published == 4


def test_rows_beyond_the_staged_ones_go_out_with_the_next_normal_step(
    tenant_a, queue_prefix, publisher
):
    at = timezone.now() + timedelta(seconds=LEAD_S)
    _one_shots(tenant_a, 5, at)
    stager = _stager(publisher, queue_prefix, max_rows=3)
    assert _stage_all(stager) == 3  # the memory bound
    _one_shots(tenant_a, 1, at)  # one more materialized after staging stopped

    staged = _publish_when_due(stager)
    rest = relay_step(leases=stager.leases, publisher=publisher, config=relay_config(queue_prefix))

    assert (staged.published, rest.published) == (3, 3)
    occurrences = list(Occurrence.objects.all())
    assert {o.state for o in occurrences} == {Occurrence.State.ENQUEUED}
    assert all(o.enqueued_at and o.enqueued_at >= o.scheduled_for for o in occurrences)
    assert sorted(_queued_ids(publisher, queue_prefix)) == sorted(str(o.id) for o in occurrences)


def test_an_instant_below_the_threshold_is_left_to_the_normal_step(
    tenant_a, queue_prefix, publisher
):
    _one_shots(tenant_a, 2, timezone.now() + timedelta(seconds=LEAD_S))
    stager = _stager(publisher, queue_prefix, min_rows=3)

    assert stager.advance() == 0
    assert stager.instant is None


def test_round_robin_takes_one_of_each_in_turn():
    turns: list[list[str]] = [["a1", "a2", "a3"], [], ["b1"], ["c1", "c2"]]
    assert round_robin(turns) == ["a1", "b1", "c1", "a2", "c2", "a3"]


@pytest.mark.django_db(transaction=True)  # the relay step runs on its own thread/connection
def test_a_schedule_change_does_not_wait_while_the_relay_waits_for_an_instant(
    tenant_a, queue_prefix, publisher
):
    at = timezone.now() + timedelta(seconds=LEAD_S)
    schedules = _one_shots(tenant_a, 3, at)
    relay_leases = leases(ShardLease.Role.RELAY)
    config = replace(relay_config(queue_prefix), lookahead_ms=3000)

    def step() -> None:
        try:
            relay_step(leases=relay_leases, publisher=publisher, config=config)
        finally:
            connection.close()

    # The step reads the rows (due within its look-ahead), then waits ~2.5 s for their instant.
    while (at - timezone.now()).total_seconds() > 2.5:
        time.sleep(0.05)
    relay = threading.Thread(target=step)
    relay.start()
    time.sleep(0.5)

    started = time.monotonic()
    _recall(schedules[0])  # takes the shard's relay barrier
    waited = time.monotonic() - started
    relay.join()

    # The change went through while the step waited for the instant, not after its publish;
    # the step then left the recalled shard's rows alone.
    assert timezone.now() >= at
    assert waited < 1.0
    recalled = Occurrence.objects.get(schedule=schedules[0])
    queued = _queued_ids(publisher, queue_prefix)
    assert str(recalled.id) not in queued
    assert recalled.state == Occurrence.State.CANCELED


@pytest.mark.django_db(transaction=True)  # the recorder thread has its own connection
def test_a_published_burst_is_read_once_for_late_rows_then_skipped_until_recorded(
    tenant_a, queue_prefix, publisher
):
    at = timezone.now() + timedelta(seconds=LEAD_S)
    _one_shots(tenant_a, 3, at)
    stager = _stager(publisher, queue_prefix)
    _stage_all(stager)
    recorder = Recorder(stager.leases)  # not started yet: the published rows stay in flight
    while not stager.publish_due():
        time.sleep(0.05)
    assert stager.publish(recorder=recorder).published == 3
    _one_shots(tenant_a, 1, at)  # materialized late, after the staging
    config = relay_config(queue_prefix)

    # The first normal step after the publish reads the instant (the late row goes out)…
    assert stager.settling(recorder) == []
    first = relay_step(leases=stager.leases, publisher=publisher, config=config, recorder=recorder)
    stager.stepped()
    assert first.published == 1
    # …later ones skip it while its published rows are being recorded…
    assert stager.settling(recorder) == [at]
    # …and read it again once they are.
    recorder.start()
    recorder.stop()
    assert stager.settling(recorder) == []
    assert set(Occurrence.objects.values_list("state", flat=True)) == {Occurrence.State.ENQUEUED}
