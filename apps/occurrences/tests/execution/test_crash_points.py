"""Crash points of materialization and dispatch with real processes
(docs/architecture.md "Crash points").

Nothing silently missed; duplicates carry the same occurrence id.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from apps.occurrences.models import DispatchOutbox, Occurrence, ShardLease
from apps.occurrences.pipeline.broker import Publisher
from apps.occurrences.pipeline.materializer import flexible_available_at, materialize_pass
from apps.occurrences.pipeline.queues import all_queue_names
from apps.occurrences.pipeline.relay import Recorder, relay_step
from apps.occurrences.tests.support.pipeline import leases, materialize_config, relay_config
from apps.occurrences.tests.support.processes import ROOT, database_url
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule
from tickweb.celery import app as celery_app


def _start(kind: str, queue_prefix: str, tmp_path: Path, **env: str) -> subprocess.Popen[bytes]:
    log = (tmp_path / f"{kind}-{uuid.uuid4().hex[:6]}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "manage.py", kind, "--idle-sleep", "0.2"],
        cwd=ROOT,
        env={
            **os.environ,
            "DATABASE_URL": database_url(connection.settings_dict),
            "TICK_QUEUE_PREFIX": queue_prefix,
            "DJANGO_DEBUG": "1",
            **env,
        },
        stdout=log,
        stderr=log,
    )


def _stop(*procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def _owners() -> set[str]:
    return set(
        ShardLease.objects.filter(
            role=ShardLease.Role.MATERIALIZER, lease_expires_at__gt=timezone.now()
        )
        .exclude(owner="")
        .values_list("owner", flat=True)
    )


@pytest.mark.django_db(transaction=True)
def test_two_materializers_share_the_shards_and_write_each_occurrence_once(
    tenant_a, queue_prefix, tmp_path
):
    # given: 200 every-minute schedules, due from the next minute on
    for _ in range(200):
        make_schedule(tenant_a)
    first, second = (_start("materialize", queue_prefix, tmp_path) for _ in range(2))
    try:
        # when both run: they split the shards between them
        assert _wait_for(lambda: len(_owners()) == 2, 30), "the two never shared the shards"
        assert _wait_for(
            lambda: (
                not Schedule.objects.filter(
                    next_run_at__lte=timezone.now() + timedelta(seconds=100)
                ).exists()
            ),
            60,
        )
    finally:
        _stop(first, second)

    # then: every expected instant exactly once, with exactly one outbox row
    schedules = list(Schedule.objects.all())
    for schedule in schedules:
        instants = list(
            Occurrence.objects.filter(schedule=schedule).values_list("scheduled_for", flat=True)
        )
        assert len(instants) == len(set(instants)) >= 1
        minutes = sorted(instants)
        assert all(
            b - a == timedelta(minutes=1) for a, b in zip(minutes, minutes[1:], strict=False)
        )
    assert DispatchOutbox.objects.count() == Occurrence.objects.count()


@pytest.mark.django_db(transaction=True)
def test_a_killed_materializers_shards_are_taken_over_within_a_lease_ttl(
    tenant_a, queue_prefix, tmp_path
):
    ttl = {"TICK_LEASE_TTL_S": "3"}
    first = _start("materialize", queue_prefix, tmp_path, **ttl)
    try:
        assert _wait_for(lambda: len(_owners()) == 1, 30)
        first.send_signal(signal.SIGKILL)
        first.wait()
        killed_at = time.monotonic()
        # a schedule comes due while nobody materializes
        schedule = make_schedule(tenant_a)
        second = _start("materialize", queue_prefix, tmp_path, **ttl)
        try:
            assert _wait_for(
                lambda: Occurrence.objects.filter(schedule=schedule).exists(), 3 + 20
            ), "the shards were never taken over"
            took = time.monotonic() - killed_at
        finally:
            _stop(second)
    finally:
        _stop(first)
    # The survivor took every shard, at a new fencing generation.
    assert ShardLease.objects.filter(role="materializer", generation__gte=2).count() == 256
    assert took < 3 + 15


@pytest.mark.django_db(transaction=True)
def test_a_stopped_materializer_that_wakes_after_takeover_cannot_move_next_run_at_back(
    tenant_a, queue_prefix, tmp_path
):
    ttl = {"TICK_LEASE_TTL_S": "2", "TICK_PLANNING_WINDOW_S": "70"}
    stale = _start("materialize", queue_prefix, tmp_path, **ttl)
    fresh = None
    try:
        schedule = make_schedule(tenant_a)
        assert _wait_for(lambda: Occurrence.objects.filter(schedule=schedule).exists(), 30)
        stale.send_signal(signal.SIGSTOP)
        time.sleep(3)  # its leases expire while it is frozen
        fresh = _start("materialize", queue_prefix, tmp_path, **ttl)
        assert _wait_for(lambda: len(_owners()) == 1 and _owners() != set(), 20)
        schedule.refresh_from_db()
        seen = [schedule.next_run_at]
        stale.send_signal(signal.SIGCONT)
        for _ in range(25):  # watch while the stale process runs again
            time.sleep(0.2)
            schedule.refresh_from_db()
            seen.append(schedule.next_run_at)
    finally:
        _stop(stale, *(p for p in [fresh] if p))
    moments = [moment for moment in seen if moment is not None]
    assert len(moments) == len(seen)
    assert all(b >= a for a, b in pairwise(moments)), seen
    instants = list(
        Occurrence.objects.filter(schedule=schedule).values_list("scheduled_for", flat=True)
    )
    assert len(instants) == len(set(instants))


@pytest.mark.django_db(transaction=True)
def test_relay_dying_after_publish_before_record_republishes_the_same_id(tenant_a, queue_prefix):
    # given: a due occurrence published by a relay that dies before recording it
    run_at = timezone.now() - timedelta(seconds=1)
    make_schedule(
        tenant_a, kind=Schedule.Kind.ONE_SHOT, expression="", run_at=run_at, next_run_at=run_at
    )
    materialize_pass(leases=leases(), now=timezone.now(), config=materialize_config())
    occurrence = Occurrence.objects.get()

    def publisher():
        pub = Publisher(
            settings.CELERY_BROKER_URL, prefix=queue_prefix,
            partitions=settings.TICK_TENANT_PARTITIONS, celery_app=celery_app,
        )  # fmt: skip
        pub.connect()
        return pub

    doomed = publisher()
    doomed_leases = leases(ShardLease.Role.RELAY, owner="doomed")
    never_runs = Recorder(doomed_leases)  # the process dies before its recorder commits
    first = relay_step(
        leases=doomed_leases, publisher=doomed, config=relay_config(queue_prefix),
        recorder=never_runs,
    )  # fmt: skip
    doomed.close()
    assert first.published == 1
    assert DispatchOutbox.objects.count() == 1  # confirmed, but not recorded

    # when: it is gone (leases expired, no longer a live member) and another relay takes over
    with connection.cursor() as cursor:
        cursor.execute("UPDATE occurrences_shardlease SET lease_expires_at = now()")
        cursor.execute("UPDATE occurrences_leasemember SET seen_at = now() - interval '1 hour'")
    survivor = publisher()
    second = relay_step(
        leases=leases(ShardLease.Role.RELAY, owner="survivor"), publisher=survivor,
        config=relay_config(queue_prefix),
    )  # fmt: skip

    # then: published again with the same id, recorded once, nothing missing
    assert second.published == 1
    received = []
    for name in all_queue_names(queue_prefix, settings.TICK_TENANT_PARTITIONS):
        while (message := survivor._channel.basic_get(name, no_ack=True)) is not None:
            received.append(json.loads(message.body)[1]["occurrence_id"])
    survivor.close()
    assert received == [str(occurrence.id), str(occurrence.id)]
    occurrence.refresh_from_db()
    assert occurrence.state == Occurrence.State.ENQUEUED
    assert DispatchOutbox.objects.count() == 0


def test_flexible_jitter_is_identical_in_another_process():
    ids = [uuid.uuid5(uuid.NAMESPACE_URL, f"tick-{n}") for n in range(50)]
    code = (
        "import sys, uuid, django; django.setup(); "
        "import datetime as d; from apps.occurrences.pipeline.materializer import "
        "flexible_available_at as f; at = d.datetime(2026, 12, 2, 12, 0, tzinfo=d.UTC); "
        "print([(f(uuid.UUID(a), at, 300) - at).total_seconds() for a in sys.argv[1:]])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *map(str, ids)],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tickweb.settings", "DJANGO_DEBUG": "1",
             "PYTHONHASHSEED": "12345"},
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    at = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    here = [(flexible_available_at(i, at, 300) - at).total_seconds() for i in ids]
    assert json.loads(out) == here
    assert all(0 <= offset < 290 for offset in here)  # the window less its end margin
    assert len(set(here)) > 30  # spread over the window's 5-second steps, not bunched


@pytest.mark.django_db(transaction=True)
def test_relay_process_killed_after_publish_before_record_is_republished_with_the_same_id(
    tenant_a, queue_prefix, publisher, tmp_path
):
    # given: a due occurrence, and its outbox row locked by another session so the relay's
    # recorder (which deletes it after the confirm) blocks right after the publish
    run_at = timezone.now() - timedelta(seconds=1)
    make_schedule(
        tenant_a, kind=Schedule.Kind.ONE_SHOT, expression="", run_at=run_at, next_run_at=run_at
    )
    materialize_pass(leases=leases(), now=timezone.now(), config=materialize_config())
    occurrence = Occurrence.objects.get()
    blocker = psycopg.connect(_libpq_dsn())
    blocker.execute("SELECT 1 FROM occurrences_dispatchoutbox FOR UPDATE")
    ttl = {"TICK_LEASE_TTL_S": "3"}
    first = _start("relay", queue_prefix, tmp_path, **ttl)
    received: list[str] = []

    def drain() -> bool:
        for name in all_queue_names(queue_prefix, settings.TICK_TENANT_PARTITIONS):
            while (message := publisher._channel.basic_get(name, no_ack=True)) is not None:
                received.append(json.loads(message.body)[1]["occurrence_id"])
        return bool(received)

    try:
        assert _wait_for(drain, 30), "the first relay never published"
        # when: the relay dies with the publish confirmed and nothing recorded
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        _stop(first)
        blocker.rollback()
        blocker.close()
    assert DispatchOutbox.objects.count() == 1
    occurrence.refresh_from_db()
    assert occurrence.enqueued_at is None

    second = _start("relay", queue_prefix, tmp_path, **ttl)
    try:
        # then: the next relay publishes the same occurrence id again and records it once
        assert _wait_for(lambda: drain() and len(received) == 2, 30), received
        assert _wait_for(lambda: not DispatchOutbox.objects.exists(), 20)
    finally:
        _stop(second)
    assert received == [str(occurrence.id), str(occurrence.id)]
    occurrence.refresh_from_db()
    assert occurrence.state == Occurrence.State.ENQUEUED
    assert occurrence.enqueued_at is not None


def _libpq_dsn() -> str:
    s = connection.settings_dict
    parts = {"dbname": s["NAME"], "user": s["USER"], "password": s["PASSWORD"],
             "host": s["HOST"], "port": s["PORT"]}  # fmt: skip
    return " ".join(f"{k}={v}" for k, v in parts.items() if v)
