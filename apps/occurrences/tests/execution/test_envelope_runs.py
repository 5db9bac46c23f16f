"""Envelope runs (execution/envelope_run.py) against the real database: a short handler's
envelope is claimed in one transaction whatever its size, each item with its own attempt and
lease; what a run may not take (an unknown handler, a busy row, a tenant at its bound, a
failure) goes the one-item way; a slot lost mid-run leaves its items to the reaper."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.occurrences.execution import envelope_run
from apps.occurrences.execution.claim import ClaimStatus, occurrence_claim
from apps.occurrences.execution.complete_batch import completions_record
from apps.occurrences.execution.envelope_run import envelope_run_claim, envelope_run_execute
from apps.occurrences.execution.reaper import attempts_reap
from apps.occurrences.execution.run import completion_record
from apps.occurrences.execution.run_times import handler_times
from apps.occurrences.models import Attempt, DispatchOutbox, Occurrence
from apps.occurrences.pipeline.materializer import materialize_pass
from apps.occurrences.tests.support.pipeline import leases, materialize_config
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _short_handlers_known(settings) -> Iterator[None]:
    # A pool process forms runs only with handlers it has seen finish quickly.
    settings.TICK_ENVELOPE_RUN_BUDGET_MS = 200
    settings.TICK_ENVELOPE_RUN_SAMPLES = 20
    handler_times.clear()
    for _ in range(20):
        handler_times.record("record", 0.002)
    yield
    handler_times.clear()


def _envelope(tenant, count: int, **schedule_fields) -> list[dict[str, str]]:
    """`count` occurrences of one tenant due at one instant, as the relay's envelope items."""
    run_at = timezone.now() - timedelta(seconds=1)
    fields = {"handler": "record", "payload": {}, **schedule_fields}
    for n in range(count):
        make_schedule(tenant, name=f"s{n}", kind=Schedule.Kind.ONE_SHOT, expression="",
                      run_at=run_at, next_run_at=run_at, **fields)  # fmt: skip
    materialize_pass(leases=leases(), now=timezone.now(), config=materialize_config())
    DispatchOutbox.objects.all().delete()
    return [
        {"occurrence_id": str(o.id), "scheduled_for": o.scheduled_for.isoformat()}
        for o in Occurrence.objects.filter(
            tenant=tenant, state=Occurrence.State.SCHEDULED
        ).order_by("schedule__name")
    ]


@contextmanager
def _row_held(occurrence_id: object, *, for_s: float | None = None) -> Iterator[Callable[[], None]]:
    """Another connection holds the occurrence's row (FOR UPDATE), as the relay's record
    statement does: for the `with` block, or for `for_s` seconds from its start; the block
    may let it go earlier with the function it is given."""
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        dsn = connection.settings_dict
        with psycopg.connect(
            host=dsn["HOST"], port=dsn["PORT"], dbname=dsn["NAME"], user=dsn["USER"],
            password=dsn["PASSWORD"],
        ) as other, other.transaction():  # fmt: skip
            other.execute(
                "SELECT 1 FROM occurrences_occurrence WHERE id = %s FOR UPDATE", [occurrence_id]
            )
            locked.set()
            release.wait(for_s if for_s is not None else 10)

    def let_go() -> None:
        release.set()
        holder.join()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10)
        yield let_go
    finally:
        if for_s is None:
            release.set()
        holder.join()


def _states() -> list[str]:
    return list(Occurrence.objects.order_by("schedule__name").values_list("state", flat=True))


def test_a_short_handlers_envelope_runs_in_one_slot_with_an_attempt_each(tenant_a, caplog):
    caplog.set_level(logging.INFO, logger="apps.occurrences.execution.envelope_run")
    items = _envelope(tenant_a, 5)

    run = envelope_run_claim(items, worker_id="host:1")

    assert run.rest == []
    assert [str(c.context.occurrence_id) for c in run.claims if c.context] == [
        i["occurrence_id"] for i in items
    ]
    assert _states() == [Occurrence.State.RUNNING] * 5
    attempts = Attempt.objects.all()
    assert len({a.lease_token for a in attempts}) == 5
    assert {a.worker_id for a in attempts} == {"host:1"}

    statuses = envelope_run_execute(run)

    assert statuses == [Occurrence.State.SUCCEEDED] * 5
    assert _states() == [Occurrence.State.SUCCEEDED] * 5
    assert set(Attempt.objects.values_list("outcome", flat=True)) == {Attempt.Outcome.SUCCEEDED}
    assert not Attempt.objects.filter(finished_at__isnull=True).exists()
    # each occurrence's success is logged with its ids, as one completed on its own is
    logged = {
        getattr(r, "occurrence_id", None)
        for r in caplog.records
        if "succeeded (run of" in r.message
    }
    assert logged == {i["occurrence_id"] for i in items}


def test_a_runs_claim_costs_the_same_statements_for_3_and_12_items(tenant_a, tenant_b):
    # a first run learns what is cached per process (the day's partitions, the slots)
    assert len(envelope_run_claim(_envelope(tenant_a, 2), worker_id="host:0").claims) == 2
    small = _envelope(tenant_a, 3)
    with CaptureQueriesContext(connection) as three:
        assert len(envelope_run_claim(small, worker_id="host:1").claims) == 3
    large = _envelope(tenant_b, 12)
    with CaptureQueriesContext(connection) as twelve:
        assert len(envelope_run_claim(large, worker_id="host:2").claims) == 12
    assert len(twelve.captured_queries) == len(three.captured_queries)


def test_an_unknown_handler_forms_no_run_and_writes_nothing(tenant_a):
    handler_times.clear()
    items = _envelope(tenant_a, 4)

    run = envelope_run_claim(items, worker_id="host:1")

    assert run.claims == [] and run.rest == items
    assert not Attempt.objects.exists()
    assert set(_states()) == {Occurrence.State.SCHEDULED}


def test_a_handler_slower_than_the_budget_runs_only_what_fits(tenant_a, settings):
    settings.TICK_ENVELOPE_RUN_BUDGET_MS = 5  # 2 ms a run: two fit, the others fan out
    items = _envelope(tenant_a, 5)

    run = envelope_run_claim(items, worker_id="host:1")

    assert len(run.claims) == 2
    assert run.rest == items[2:]
    assert Attempt.objects.count() == 2


def test_a_tenant_holding_its_slots_forms_no_run(tenant_a):
    tenant_a.max_running = 1
    tenant_a.save(update_fields=["max_running"])
    busy, *items = _envelope(tenant_a, 4)
    held = occurrence_claim(
        occurrence_id=uuid.UUID(busy["occurrence_id"]),
        scheduled_for=datetime.fromisoformat(busy["scheduled_for"]),
        worker_id="host:9",
    )
    assert held.status == ClaimStatus.CLAIMED

    run = envelope_run_claim(items, worker_id="host:1")

    assert run.claims == [] and run.rest == items
    assert Attempt.objects.count() == 1


def test_a_failure_in_a_run_is_retried_on_its_own_while_the_others_succeed(tenant_a):
    items = _envelope(tenant_a, 3)
    Schedule.objects.filter(name="s1").update(payload={"fail": "transient"})

    statuses = envelope_run_execute(envelope_run_claim(items, worker_id="host:1"))

    assert sorted(statuses) == sorted(
        [Occurrence.State.SUCCEEDED] * 2 + [Occurrence.State.RETRY_WAIT]
    )
    assert _states() == [Occurrence.State.SUCCEEDED, Occurrence.State.RETRY_WAIT,
                         Occurrence.State.SUCCEEDED]  # fmt: skip


def test_a_slot_lost_mid_run_leaves_every_item_to_the_reaper_under_its_own_id(tenant_a):
    items = _envelope(tenant_a, 4)
    run = envelope_run_claim(items, worker_id="host:1")
    assert len(run.claims) == 4
    # the pool process dies before running any: its leases run out
    Attempt.objects.update(lease_expires_at=timezone.now() - timedelta(seconds=1))

    reaped = attempts_reap(now=timezone.now(), grace_s=0)

    assert reaped.expired == 4
    requeued = set(DispatchOutbox.objects.values_list("occurrence_id", flat=True))
    assert {str(o) for o in requeued} == {i["occurrence_id"] for i in items}


@pytest.mark.django_db(transaction=True)
def test_a_row_another_transaction_holds_is_passed_by_and_fans_out(tenant_a):
    items = _envelope(tenant_a, 4)
    busy = items[2]
    with _row_held(busy["occurrence_id"]):
        run = envelope_run_claim(items, worker_id="host:1")

    assert run.rest == [busy]
    assert len(run.claims) == 3


@pytest.mark.django_db(transaction=True)
def test_a_success_whose_row_is_busy_is_written_on_its_own_once_free(tenant_a, monkeypatch):
    items = _envelope(tenant_a, 3)
    run = envelope_run_claim(items, worker_id="host:1")
    busy = run.claims[1].context
    assert busy is not None
    on_their_own: list[str] = []
    record_alone = completion_record

    def spy(claim, error):
        assert claim.context is not None
        on_their_own.append(str(claim.context.occurrence_id))
        return record_alone(claim, error)

    monkeypatch.setattr(envelope_run, "completion_record", spy)
    # the relay recording the row just then: held for half a second
    with _row_held(busy.occurrence_id, for_s=0.5):
        statuses = envelope_run_execute(run)

    assert statuses == [Occurrence.State.SUCCEEDED] * 3
    assert on_their_own == [str(busy.occurrence_id)]
    assert _states() == [Occurrence.State.SUCCEEDED] * 3
    assert not Attempt.objects.filter(finished_at__isnull=True).exists()


@pytest.mark.django_db(transaction=True)
def test_members_busy_for_a_moment_are_written_together_once_more(tenant_a, monkeypatch):
    # `noop` writes nothing (`record` would wait for the held rows: its effect's key)
    for _ in range(20):
        handler_times.record("noop", 0.001)
    items = _envelope(tenant_a, 4, handler="noop")
    run = envelope_run_claim(items, worker_id="host:1")
    busy = [c.context.occurrence_id for c in run.claims[1:3] if c.context]
    on_their_own: list[object] = []

    def alone(claim, error):
        on_their_own.append(claim)
        return completion_record(claim, error)

    monkeypatch.setattr(envelope_run, "completion_record", alone)
    batches: list[int] = []

    with _row_held(busy[0]) as let_go_first, _row_held(busy[1]) as let_go_second:

        def recorded_then_relay_commits(batch):
            batches.append(len(batch))
            written = completions_record(batch)
            if len(batches) == 1:  # the relay's record commits before the run tries again
                let_go_first()
                let_go_second()
            return written

        monkeypatch.setattr(envelope_run, "completions_record", recorded_then_relay_commits)
        statuses = envelope_run_execute(run)

    assert statuses == [Occurrence.State.SUCCEEDED] * 4
    assert batches == [4, 2]  # the two busy members in one statement, not one by one
    assert on_their_own == []
    assert _states() == [Occurrence.State.SUCCEEDED] * 4
