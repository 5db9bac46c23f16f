"""Group commit of successful completions (execution/complete_batch.py) against the real
database: per-member fencing, all-or-nothing batches, a lost queue left to the reaper."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from apps.occurrences.execution import complete_batch, run
from apps.occurrences.execution.claim import Claim, ClaimStatus, occurrence_claim
from apps.occurrences.execution.complete_batch import (
    Completion,
    CompletionGroup,
    completions_record,
)
from apps.occurrences.execution.reaper import attempts_reap
from apps.occurrences.execution.run import occurrence_execute
from apps.occurrences.models import Attempt, DispatchOutbox, Occurrence
from apps.occurrences.pipeline.materializer import materialize_pass
from apps.occurrences.tests.support.pipeline import leases, materialize_config
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _grouping_on(settings):
    # Off by default (docs/decisions.md "Claim and completion in fewer round trips"); these
    # tests are about the group, so it is on unless a test turns it off.
    settings.TICK_COMPLETION_GROUP_MS = 50


def _occurrences(tenant, count: int, **schedule_fields) -> list[Occurrence]:
    run_at = timezone.now() - timedelta(seconds=1)
    for n in range(count):
        make_schedule(tenant, name=f"s{n}", kind=Schedule.Kind.ONE_SHOT, expression="",
                      run_at=run_at, next_run_at=run_at, handler="noop", payload={},
                      **schedule_fields)  # fmt: skip
    materialize_pass(leases=leases(), now=timezone.now(), config=materialize_config())
    DispatchOutbox.objects.all().delete()
    return list(Occurrence.objects.order_by("id"))


def _claim(occ: Occurrence, worker: str = "w1") -> Claim:
    claim = occurrence_claim(
        occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id=worker
    )
    assert claim.status == ClaimStatus.CLAIMED
    return claim


def _done(claim: Claim) -> Completion:
    return Completion.of(claim, timezone.now())


def _state(occ: Occurrence) -> str:
    occ.refresh_from_db()
    return occ.state


def test_a_batch_records_its_members_in_one_go(tenant_a):
    occs = _occurrences(tenant_a, 3)
    claims = [_claim(o) for o in occs]

    recorded = completions_record([_done(c) for c in claims])

    assert recorded.succeeded == {c.attempt_id for c in claims}
    assert [_state(o) for o in occs] == [Occurrence.State.SUCCEEDED] * 3
    assert set(Attempt.objects.values_list("outcome", flat=True)) == {Attempt.Outcome.SUCCEEDED}
    assert Attempt.objects.filter(finished_at__isnull=True).count() == 0


def test_a_fenced_out_member_is_left_alone_and_the_others_commit(tenant_a):
    # given: three claimed attempts; the middle one's lease expired, the reaper took it back
    # and a newer attempt of the same occurrence is running now
    first, middle, last = _occurrences(tenant_a, 3)
    claims = [_claim(first), _claim(middle), _claim(last)]
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE occurrences_attempt SET lease_expires_at = now() - interval '1 hour' "
            "WHERE id = %s", [claims[1].attempt_id],
        )  # fmt: skip
    assert attempts_reap(now=timezone.now(), grace_s=0).expired == 1
    Occurrence.objects.filter(id=middle.id).update(state=Occurrence.State.ENQUEUED)
    newer = _claim(middle, worker="w2")
    assert newer.context is not None and newer.context.attempt_no == 2

    # when: the old attempt's success arrives in the batch
    recorded = completions_record([_done(c) for c in claims])

    # then: only the two attempts that still hold their lease were written; the newer
    # attempt of the middle occurrence keeps running, the reaped one stays LEASE_EXPIRED
    assert recorded.succeeded == {claims[0].attempt_id, claims[2].attempt_id}
    assert (_state(first), _state(middle), _state(last)) == (
        Occurrence.State.SUCCEEDED, Occurrence.State.RUNNING, Occurrence.State.SUCCEEDED,
    )  # fmt: skip
    outcomes = dict(
        Attempt.objects.filter(occurrence_id=middle.id).values_list("attempt_no", "outcome")
    )
    assert outcomes == {1: Attempt.Outcome.LEASE_EXPIRED, 2: ""}


def test_a_failure_between_members_writes_none_and_the_next_flush_writes_all(tenant_a, monkeypatch):
    # given: a batch whose transaction fails after its attempts were locked, at its write
    # (a crash between the batch's statements)
    occs = _occurrences(tenant_a, 2)
    group = CompletionGroup(flusher=False)
    for claim in [_claim(o) for o in occs]:
        group.add(_done(claim))
    real = complete_batch._SUCCEED_AND_CLOSE
    monkeypatch.setattr(complete_batch, "_SUCCEED_AND_CLOSE", "SELECT 1/0")

    # when
    assert group.flush() == 0

    # then: nothing of the batch is written, and the batch is still queued
    assert [_state(o) for o in occs] == [Occurrence.State.RUNNING] * 2
    assert Attempt.objects.filter(finished_at__isnull=True).count() == 2
    assert group.pending() == 2

    monkeypatch.setattr(complete_batch, "_SUCCEED_AND_CLOSE", real)
    assert group.flush() == 2
    assert [_state(o) for o in occs] == [Occurrence.State.SUCCEEDED] * 2
    assert group.pending() == 0


def test_a_queue_lost_with_its_process_is_rerun_after_the_lease(tenant_a, monkeypatch):
    # given: a pool process ran the handler and queued its success, then died before the flush
    (occ,) = _occurrences(tenant_a, 1)
    monkeypatch.setattr(run, "in_pool_process", lambda: True)
    monkeypatch.setattr(complete_batch, "group", CompletionGroup(flusher=False))
    summary = occurrence_execute(occurrence_id=occ.id, scheduled_for=occ.scheduled_for,
                                 worker_id="w1")  # fmt: skip
    assert summary["grouped"] and _state(occ) == Occurrence.State.RUNNING
    monkeypatch.setattr(complete_batch, "group", CompletionGroup(flusher=False))  # lost

    # when: its lease expires, the reaper re-queues it and the redelivery runs it again
    later = timezone.now() + timedelta(seconds=settings.TICK_ATTEMPT_LEASE_S + 11)
    assert attempts_reap(now=later, grace_s=10).requeued == 1
    monkeypatch.setattr(run, "in_pool_process", lambda: False)
    Occurrence.objects.filter(id=occ.id).update(state=Occurrence.State.ENQUEUED)
    occurrence_execute(occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w2")

    # then: at least once — it ran again under the same id and succeeded
    assert _state(occ) == Occurrence.State.SUCCEEDED
    outcomes = list(Attempt.objects.filter(occurrence_id=occ.id).order_by("attempt_no")
                    .values_list("outcome", flat=True))  # fmt: skip
    assert outcomes == [Attempt.Outcome.LEASE_EXPIRED, Attempt.Outcome.SUCCEEDED]


@pytest.mark.parametrize(
    ("policy", "grouped"),
    [(Schedule.OverlapPolicy.ALLOW, True), (Schedule.OverlapPolicy.SKIP_IF_RUNNING, False),
     (Schedule.OverlapPolicy.QUEUE_ONE, False)],
)  # fmt: skip
def test_only_successes_of_allow_schedules_wait_for_the_group(
    tenant_a, monkeypatch, policy, grouped
):
    # A claim of SKIP_IF_RUNNING / QUEUE_ONE looks for a RUNNING occurrence of its schedule:
    # those complete at once, as before.
    (occ,) = _occurrences(tenant_a, 1, overlap_policy=policy)
    group = CompletionGroup(flusher=False)
    monkeypatch.setattr(run, "in_pool_process", lambda: True)
    monkeypatch.setattr(complete_batch, "group", group)

    occurrence_execute(occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w1")

    assert group.pending() == (1 if grouped else 0)
    assert _state(occ) == (Occurrence.State.RUNNING if grouped else Occurrence.State.SUCCEEDED)
    group.flush()
    assert _state(occ) == Occurrence.State.SUCCEEDED


def test_grouping_is_off_at_zero(tenant_a, monkeypatch, settings):
    settings.TICK_COMPLETION_GROUP_MS = 0
    (occ,) = _occurrences(tenant_a, 1)
    monkeypatch.setattr(run, "in_pool_process", lambda: True)

    summary = occurrence_execute(occurrence_id=occ.id, scheduled_for=occ.scheduled_for,
                                 worker_id="w1")  # fmt: skip

    assert "grouped" not in summary and _state(occ) == Occurrence.State.SUCCEEDED
