"""Fair share of worker slots: the capacity the live workers announce, and claims beyond a
tenant's share of it delayed through the outbox while another tenant contends (a tenant alone
may use every slot) — against the real database, and end to end with a real relay, RabbitMQ
and a Celery worker."""

from __future__ import annotations

import itertools
import math
import os
import signal
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.db.models import Value
from django.db.models.functions import Replace
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client import REGISTRY

from apps.occurrences.execution import presence
from apps.occurrences.execution.claim import ClaimStatus, deferral_delay_s, occurrence_claim
from apps.occurrences.execution.complete import attempt_complete
from apps.occurrences.execution.presence import (
    Contention,
    capacity_forget,
    contention_forget,
    fair_limit,
    live_capacity,
    presence_beat,
    presence_leave,
    tenant_slot_limit,
    water_fill,
)
from apps.occurrences.models import (
    Attempt,
    DispatchOutbox,
    Lane,
    Occurrence,
    WorkerPresence,
)
from apps.occurrences.tests.support.processes import ProcessStack, shared_stack_env
from apps.occurrences.tests.support.rows import occurrence, schedule, state_of
from apps.tenants.models import Tenant
from apps.tenants.tests.races import run_at_once
from tickweb.checks import check_fair_share, check_value_ranges

pytestmark = pytest.mark.clock_edge


@pytest.fixture(autouse=True)
def _share_of_half(settings) -> None:
    # The figures below assume these (the defaults); the root conftest forgets the cache.
    settings.TICK_TENANT_SLOT_SHARE, settings.TICK_WORKER_SLOTS = 0.5, 0
    settings.TICK_WORKER_PRESENCE_TTL_S = 30


def _worker(hostname: str, slots: int, *, seen_s_ago: float = 0) -> None:
    WorkerPresence.objects.create(
        hostname=hostname, slots=slots, seen_at=timezone.now() - timedelta(seconds=seen_s_ago)
    )


# Each claim comes from a pool process of its own ("<hostname>:<pid>", tasks.py): a tenant's
# running work is counted in worker slots, one per worker id (docs/decisions.md, "A tenant's
# running work counted in worker slots").
_pids = itertools.count(1)


def _claim(occ: Occurrence, now: datetime, *, worker_id: str | None = None):
    return occurrence_claim(
        occurrence_id=occ.id, scheduled_for=occ.scheduled_for,
        worker_id=worker_id or f"w:{next(_pids)}", now=now,
    )  # fmt: skip


def _fair_share_delays() -> float:
    return REGISTRY.get_sample_value("tick_fair_share_delayed_total") or 0.0


def _waiting(tenant: Tenant, count: int) -> list[Occurrence]:
    """`count` occurrences of the tenant published and waiting to be claimed (ENQUEUED);
    this process's cached contention answer is forgotten."""
    now = timezone.now()
    occs = [occurrence(schedule(tenant, name=f"w{i}"), now) for i in range(count)]
    Occurrence.objects.filter(id__in=[o.id for o in occs]).update(enqueued_at=now)
    contention_forget()
    return occs


def _claims_of(tenant: Tenant, count: int, now: datetime) -> list[ClaimStatus]:
    """Claim `count` fresh occurrences of the tenant one after another."""
    occs = [occurrence(schedule(tenant, name=f"{tenant.slug}{i}"), now) for i in range(count)]
    return [_claim(o, now).status for o in occs]


# --- capacity -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_capacity_sums_the_slots_of_live_workers_only():
    _worker("a@host", 4)
    _worker("b@host", 2, seen_s_ago=20)
    _worker("crashed@host", 8, seen_s_ago=45)  # unseen for longer than the TTL

    assert live_capacity() == 6
    assert tenant_slot_limit() == 3


@pytest.mark.django_db
def test_worker_slots_setting_overrides_the_announced_capacity(settings):
    _worker("a@host", 4)
    settings.TICK_WORKER_SLOTS = 10

    assert live_capacity() == 10
    assert tenant_slot_limit() == 5


@pytest.mark.django_db
def test_no_live_worker_means_no_share_limit_and_one_slot_still_gives_one():
    _worker("gone@host", 16, seen_s_ago=120)
    assert live_capacity() is None
    assert tenant_slot_limit() is None

    capacity_forget()
    _worker("lone@host", 1)
    assert tenant_slot_limit() == 1  # max(1, floor(1 x 0.5))


@pytest.mark.django_db
def test_a_beat_upserts_the_worker_and_a_clean_leave_removes_it(django_assert_num_queries):
    presence_beat(hostname="w1@host", slots=2)
    presence_beat(hostname="w1@host", slots=3)  # the pool was resized between beats
    presence_beat(hostname="w2@host", slots=1)
    assert live_capacity() == 4
    with django_assert_num_queries(0):  # claims within the cache span cost no query
        assert live_capacity() == 4

    presence_leave(hostname="w1@host")
    capacity_forget()

    assert list(WorkerPresence.objects.values_list("hostname", "slots")) == [("w2@host", 1)]
    assert live_capacity() == 1


@pytest.mark.parametrize(
    ("overrides", "error_ids"),
    [
        ({}, []),
        ({"TICK_TENANT_SLOT_SHARE": 1.0}, []),
        ({"TICK_TENANT_SLOT_SHARE": 0.0}, ["tick.E011"]),
        ({"TICK_TENANT_SLOT_SHARE": 1.5}, ["tick.E011"]),
        ({"TICK_WORKER_PRESENCE_INTERVAL_S": 30}, ["tick.E012"]),
    ],
)
def test_the_share_and_the_presence_beat_are_bounded(settings, overrides, error_ids):
    settings.TICK_WORKER_PRESENCE_INTERVAL_S = 10
    for name, value in overrides.items():
        setattr(settings, name, value)

    assert [message.id for message in check_fair_share()] == error_ids


@pytest.mark.parametrize(("window_s", "error_ids"), [(60, []), (1, []), (0, ["tick.E004"])])
def test_the_deferral_alert_bound_must_be_positive(settings, window_s, error_ids):
    settings.TICK_DEFERRAL_ALERT_S = window_s

    messages = [m for m in check_value_ranges() if "TICK_DEFERRAL_ALERT_S" in m.msg]
    assert [message.id for message in messages] == error_ids


# --- claims -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_over_share_claims_are_deferred_not_dropped_and_run_once_slots_free_up(tenant_a, tenant_b):
    # given: 4 live slots, another tenant with 2 occurrences waiting (so a's max-min share is
    # 2), a tenant allowed 100, and 5 due at once
    _worker("w@host", 4)
    _waiting(tenant_b, 2)
    now = timezone.now()
    occs = [occurrence(schedule(tenant_a, name=f"s{i}"), now) for i in range(5)]
    delays_before = _fair_share_delays()

    # when: 5 workers claim at the same moment
    claims = run_at_once(len(occs), lambda i: _claim(occs[i], now))

    # then: 2 run; 3 wait in the retry lane 4-8 s later (fresh arrivals), still ENQUEUED,
    # counted as share
    statuses = [c.status for c in claims]
    assert statuses.count(ClaimStatus.CLAIMED) == 2
    assert statuses.count(ClaimStatus.DELAYED) == 3
    delayed = DispatchOutbox.objects.filter(tenant_id=tenant_a.id)
    assert delayed.count() == 3 and {d.lane for d in delayed} == {Lane.RETRY}
    assert all(now + timedelta(seconds=4) <= d.available_at <= now + timedelta(seconds=8)
               for d in delayed)  # fmt: skip
    waiting = [o for o, s in zip(occs, statuses, strict=True) if s == ClaimStatus.DELAYED]
    assert [state_of(o) for o in waiting] == ["ENQUEUED"] * 3
    assert _fair_share_delays() - delays_before == 3

    # when: the two running ones finish and the delayed ones come back
    for claim in (c for c in claims if c.status == ClaimStatus.CLAIMED):
        attempt_complete(claim=claim, now=now + timedelta(seconds=1))
    later = now + timedelta(seconds=4)
    contention_forget()
    second = [_claim(o, later) for o in waiting]

    # then: two more run, the third is delayed again; once those end it runs too
    assert [c.status for c in second].count(ClaimStatus.CLAIMED) == 2
    for claim in (c for c in second if c.status == ClaimStatus.CLAIMED):
        attempt_complete(claim=claim, now=later + timedelta(seconds=1))
    last = next(o for o, c in zip(waiting, second, strict=True) if c.status != ClaimStatus.CLAIMED)
    contention_forget()
    assert _claim(last, later + timedelta(seconds=4)).status == ClaimStatus.CLAIMED
    assert Attempt.objects.filter(tenant=tenant_a).count() == 5
    assert sorted(state_of(o) for o in occs) == ["RUNNING"] + ["SUCCEEDED"] * 4


@pytest.mark.django_db
def test_an_occurrence_deferred_before_asks_again_ahead_of_fresh_arrivals(tenant_a, tenant_b):
    # given: tenant a at its share of 2 while b has work waiting
    _worker("w@host", 4)
    _waiting(tenant_b, 2)
    now = timezone.now()
    assert _claims_of(tenant_a, 2, now) == [ClaimStatus.CLAIMED] * 2
    fresh = occurrence(schedule(tenant_a, name="fresh"), now)
    Occurrence.objects.filter(id=fresh.id).update(enqueued_at=now, last_enqueued_at=now)
    deferred = occurrence(schedule(tenant_a, name="deferred"), now)
    Occurrence.objects.filter(id=deferred.id).update(
        enqueued_at=now - timedelta(minutes=4), last_enqueued_at=now - timedelta(seconds=3)
    )

    # when: both are deferred again
    assert [_claim(o, now).status for o in (fresh, deferred)] == [ClaimStatus.DELAYED] * 2
    again = {
        o.id: (DispatchOutbox.objects.get(occurrence_id=o.id).available_at - now).total_seconds()
        for o in (fresh, deferred)
    }

    # then: the one deferred before asks again within 2-4 s, the fresh one after 4-8 s
    assert 2 <= again[deferred.id] <= 4
    assert 4 <= again[fresh.id] <= 8
    assert deferral_delay_s(10_000, base_s=20, jitter=0.9, deferred_before=False) == 30


@pytest.mark.django_db
def test_a_quiet_tenant_claims_while_the_noisy_one_holds_its_share(tenant_a, tenant_b):
    _worker("w@host", 4)
    now = timezone.now()
    noisy = [occurrence(schedule(tenant_a, name=f"n{i}"), now) for i in range(4)]
    quiet = _waiting(tenant_b, 1)[0]

    noisy_statuses = [_claim(o, now).status for o in noisy]
    quiet_status = _claim(quiet, now).status

    # the quiet tenant waits for one slot: the noisy one may take the other three
    assert noisy_statuses == [ClaimStatus.CLAIMED] * 3 + [ClaimStatus.DELAYED]
    assert quiet_status == ClaimStatus.CLAIMED
    assert not DispatchOutbox.objects.filter(tenant_id=tenant_b.id).exists()


@pytest.mark.django_db
def test_the_share_never_lifts_max_running_and_is_counted_apart_from_it(tenant_a):
    _worker("w@host", 40)  # share 20
    tenant_a.max_running = 1
    tenant_a.save(update_fields=["max_running"])
    now = timezone.now()
    first, second = (occurrence(schedule(tenant_a, name=f"s{i}"), now) for i in range(2))
    delays_before = _fair_share_delays()

    statuses = [_claim(first, now).status, _claim(second, now).status]

    assert statuses == [ClaimStatus.CLAIMED, ClaimStatus.DELAYED]
    assert _fair_share_delays() == delays_before  # a quota delay, not a share delay


# --- work-conserving: the share binds only while another tenant has work waiting ----------


def _other_ran_a_moment_ago(tenant: Tenant) -> None:
    done = occurrence(schedule(tenant, name="done"), timezone.now())
    claim = _claim(done, timezone.now())
    attempt_complete(claim=claim)


def _other_still_running_a_long_run(tenant: Tenant) -> None:
    long_run = occurrence(schedule(tenant, name="long"), timezone.now())
    assert _claim(long_run, timezone.now()).status == ClaimStatus.CLAIMED


@pytest.mark.parametrize(
    "other", [lambda tenant: None, _other_ran_a_moment_ago, _other_still_running_a_long_run]
)
@pytest.mark.django_db
def test_a_tenant_uses_every_slot_while_no_other_tenant_has_work_waiting(tenant_a, tenant_b, other):
    # given: 4 live slots (share 2); the other tenant idle, just done, or running but with
    # nothing waiting: recent activity is not contention
    _worker("w@host", 4)
    other(tenant_b)
    delays_before = _fair_share_delays()

    # when: the tenant has 4 due at once
    statuses = _claims_of(tenant_a, 4, timezone.now())

    # then: all 4 run, nothing is deferred
    assert statuses == [ClaimStatus.CLAIMED] * 4
    assert not DispatchOutbox.objects.exists()
    assert _fair_share_delays() == delays_before


@pytest.mark.django_db
def test_another_tenants_waiting_work_brings_the_share_back_until_it_is_claimed(tenant_a, tenant_b):
    _worker("w@host", 4)
    others = _waiting(tenant_b, 2)
    delays_before = _fair_share_delays()

    statuses = _claims_of(tenant_a, 4, timezone.now())

    assert statuses == [ClaimStatus.CLAIMED] * 2 + [ClaimStatus.DELAYED] * 2
    assert DispatchOutbox.objects.filter(tenant_id=tenant_a.id).count() == 2
    assert _fair_share_delays() - delays_before == 2

    # when: the other tenant's waiting work is claimed, nothing of it waits any more
    assert [_claim(o, timezone.now()).status for o in others] == [ClaimStatus.CLAIMED] * 2
    contention_forget()
    # then: the tenant takes the slots beyond its share again
    assert _claims_of(tenant_a, 1, timezone.now()) == [ClaimStatus.CLAIMED]


@pytest.mark.parametrize("gone", ["worker_presence_expired", "lease_expired"])
@pytest.mark.django_db
def test_attempts_of_a_gone_worker_or_past_their_lease_do_not_hold_slots(tenant_a, tenant_b, gone):
    # given: 4 live slots; tenant a's two attempts on a worker that was killed or frozen
    # (its presence row went stale) or whose leases expired; b has 2 waiting
    _worker("w@host", 4)
    _worker("frozen@host", 4, seen_s_ago=120)
    now = timezone.now()
    stale = [occurrence(schedule(tenant_a, name=f"old{i}"), now) for i in range(2)]
    for pid, occ in enumerate(stale, start=4242):
        claim = occurrence_claim(occurrence_id=occ.id, scheduled_for=occ.scheduled_for,
                                 worker_id=f"frozen@host:{pid}", now=now)  # fmt: skip
        assert claim.status == ClaimStatus.CLAIMED
    if gone == "lease_expired":
        Attempt.objects.filter(tenant=tenant_a).update(
            worker_id=Replace("worker_id", Value("frozen@host:"), Value("w@host:")),
            lease_expires_at=now - timedelta(seconds=1),
        )
    _waiting(tenant_b, 2)

    # when: tenant a's fresh work is claimed
    statuses = _claims_of(tenant_a, 3, now)

    # then: the gone attempts hold no slot: a runs its share of 2 live ones
    assert statuses == [ClaimStatus.CLAIMED] * 2 + [ClaimStatus.DELAYED]


@pytest.mark.django_db
def test_a_tenants_live_attempts_on_one_worker_hold_one_slot_of_its_share(tenant_a, tenant_b):
    # given: 4 live slots (share 2); tenant a runs two occurrences in one pool process (an
    # envelope run: docs/decisions.md "A tenant's running work counted in worker slots") and
    # one on a frozen worker, so its open attempts reach its share; b has 2 waiting
    _worker("w@host", 4)
    _worker("frozen@host", 4, seen_s_ago=120)
    now = timezone.now()
    for worker_id, name in (("w@host:1", "r0"), ("w@host:1", "r1"), ("frozen@host:7", "r2")):
        occ = occurrence(schedule(tenant_a, name=name), now)
        assert _claim(occ, now, worker_id=worker_id).status == ClaimStatus.CLAIMED
    _waiting(tenant_b, 2)

    # when: another pool process claims tenant a's next occurrence
    claim = _claim(occurrence(schedule(tenant_a, name="next"), now), now, worker_id="w@host:2")

    # then: a holds one live slot of its 2: the claim runs
    assert claim.status == ClaimStatus.CLAIMED


@pytest.mark.django_db
def test_another_tenants_run_on_one_worker_is_one_slot_of_its_demand(tenant_a, tenant_b):
    # given: 6 live slots (share 3); tenant b runs two occurrences in one pool process and
    # has 1 waiting (a demand of 2 slots, not 3); tenant a runs 3 on 3 pool processes
    _worker("w@host", 6)
    now = timezone.now()
    for name in ("r0", "r1"):
        occ = occurrence(schedule(tenant_b, name=name), now)
        assert _claim(occ, now, worker_id="w@host:1").status == ClaimStatus.CLAIMED
    assert _claims_of(tenant_a, 3, now) == [ClaimStatus.CLAIMED] * 3
    _waiting(tenant_b, 1)

    # when: tenant a's next occurrence is claimed
    claim = _claim(occurrence(schedule(tenant_a, name="next"), now), now)

    # then: a's max-min limit is 6 - 2 = 4 slots: the claim runs
    assert claim.status == ClaimStatus.CLAIMED


def test_max_min_allocation_meets_small_demands_and_splits_the_rest():
    a, b, c = (uuid.uuid4() for _ in range(3))
    allocation = water_fill(6, {a: math.inf, b: 1, c: 5})
    assert allocation == {b: 1, c: 2.5, a: 2.5}
    assert fair_limit(a, 6, Contention(running={}, waiting={b: 1, c: 5})) == 2
    assert fair_limit(a, 6, Contention(running={a: 5}, waiting={a: 9})) is None


@pytest.mark.django_db
def test_a_deferral_after_a_long_wait_while_a_slot_is_free_is_counted(tenant_a, tenant_b, settings):
    settings.TICK_DEFERRAL_ALERT_S = 60
    _worker("w@host", 4)
    _waiting(tenant_b, 2)
    now = timezone.now()
    assert _claims_of(tenant_a, 2, now) == [ClaimStatus.CLAIMED] * 2
    old = occurrence(schedule(tenant_a, name="old"), now)
    Occurrence.objects.filter(id=old.id).update(enqueued_at=now - timedelta(minutes=3))
    before = REGISTRY.get_sample_value("tick_deferred_beside_free_slots_total") or 0.0

    # 2 of 4 slots run: two are free while the old one is deferred again
    assert _claim(old, now).status == ClaimStatus.DELAYED

    after = REGISTRY.get_sample_value("tick_deferred_beside_free_slots_total") or 0.0
    assert after - before == 1


@pytest.mark.django_db
def test_a_claim_under_its_share_never_asks_whether_others_wait(tenant_a, tenant_b):
    _worker("w@host", 4)
    _waiting(tenant_b, 2)
    now = timezone.now()
    occs = [occurrence(schedule(tenant_a, name=f"s{i}"), now) for i in range(4)]

    reads = []
    for occ in occs:
        with CaptureQueriesContext(connection) as queries:
            _claim(occ, now)
        reads.append(sum("FULL JOIN waiting" in q["sql"] for q in queries))

    # two under the share: no read; the third asks once; the fourth is answered from cache
    assert reads == [0, 0, 1, 0]


# --- end to end ---------------------------------------------------------------------------


def _due_through_the_outbox(occ: Occurrence) -> None:
    """Hand the occurrence to the relay, as the materializer does."""
    DispatchOutbox.objects.create(
        occurrence_id=occ.id, scheduled_for=occ.scheduled_for, schedule_id=occ.schedule_id,
        schedule_version=occ.schedule_version, tenant_id=occ.tenant_id,
        shard=occ.schedule.shard, lane=Lane.STRICT, available_at=occ.scheduled_for,
        created_at=timezone.now(),
    )  # fmt: skip


def _wait_for(predicate, timeout_s: float, stack: ProcessStack, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        stack.assert_alive()
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (a Celery worker's main process and its pool), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(parents.get(current, []))
    return tree


def _signal_tree(pid: int, signum: int) -> None:
    for member in _process_tree(pid):
        try:
            os.kill(member, signum)
        except ProcessLookupError:
            pass


WORKERS, SLOTS, SLEEP_S, BURST = ("kill", "stop", "live"), 2, 10.0, 20


@pytest.fixture
def stack(queue_prefix: str, tmp_path: Path) -> Iterator[ProcessStack]:
    env = shared_stack_env(
        queue_prefix,
        TICK_TENANT_SLOT_SHARE="0.5",
        TICK_WORKER_SLOTS="0",
        TICK_WORKER_PRESENCE_INTERVAL_S="1",
        TICK_WORKER_PRESENCE_TTL_S="4",
    )
    processes = ProcessStack(tmp_path, env)
    processes.start_role("relay")
    for name in WORKERS:
        processes.start_role("worker", name=name, concurrency=SLOTS)
    faulted = {name: processes.procs[name] for name in ("kill", "stop")}
    yield processes
    for proc in faulted.values():  # the frozen one cannot take a SIGTERM
        _signal_tree(proc.pid, signal.SIGKILL)
        proc.wait()
    processes.stop_all()


def _started_by(worker: str) -> int:
    return Attempt.objects.filter(worker_id__startswith=f"{worker}-").count()


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_burst_runs_on_free_slots_beside_a_killed_and_a_frozen_worker(
    tenant_a, tenant_b, stack, settings
):
    settings.TICK_WORKER_PRESENCE_TTL_S = 4
    # given: three workers of 2 slots; tenant b ran a moment ago and has nothing waiting
    _wait_for(lambda: WorkerPresence.objects.filter(slots=SLOTS).count() == 3, 60, stack,
              "the workers' presence")  # fmt: skip
    earlier = occurrence(schedule(tenant_b, name="earlier"), timezone.now(),
                         state=Occurrence.State.SCHEDULED)  # fmt: skip
    _due_through_the_outbox(earlier)
    _wait_for(lambda: state_of(earlier) == Occurrence.State.SUCCEEDED, 30, stack,
              "tenant b's earlier run")  # fmt: skip
    # and tenant a's six sleepers fill every slot (one message each: distinct instants)
    now = timezone.now()
    sleepers = [
        occurrence(schedule(tenant_a, name=f"sleep{i}", payload={"sleep_s": SLEEP_S}),
                   now + timedelta(milliseconds=i), state=Occurrence.State.SCHEDULED)
        for i in range(len(WORKERS) * SLOTS)
    ]  # fmt: skip
    for occ in sleepers:
        _due_through_the_outbox(occ)
    _wait_for(lambda: Attempt.objects.filter(tenant=tenant_a).count() == len(sleepers), 30,
              stack, "every sleeper to start")  # fmt: skip
    assert _started_by("kill") >= 1 and _started_by("stop") >= 1

    # when: one worker is SIGKILLed and another SIGSTOPped with their sleepers' attempts open
    # (no reaper runs: their leases stay valid), and the live worker's sleepers end
    kill, stop = stack.procs.pop("kill"), stack.procs.pop("stop")  # no longer asserted alive
    _signal_tree(kill.pid, signal.SIGKILL)
    kill.wait()
    _signal_tree(stop.pid, signal.SIGSTOP)

    def live_idle() -> bool:
        return not Attempt.objects.filter(
            worker_id__startswith="live-", finished_at__isnull=True
        ).exists()

    _wait_for(live_idle, 60, stack, "the live worker's sleepers to end")
    time.sleep(4 + 2 + 1)  # presence TTL + the capacity cache: the gone workers drop out
    assert Attempt.objects.filter(tenant=tenant_a, finished_at__isnull=True).count() >= 2
    # and tenant a's burst falls due
    due = timezone.now() + timedelta(seconds=1)
    burst = [
        occurrence(schedule(tenant_a, name=f"burst{i}"), due, state=Occurrence.State.SCHEDULED)
        for i in range(BURST)
    ]  # fmt: skip
    for occ in burst:
        _due_through_the_outbox(occ)

    # then: the burst runs on the live worker's free slots, promptly, never deferred
    _wait_for(lambda: all(state_of(o) == Occurrence.State.SUCCEEDED for o in burst), 60,
              stack, "the burst to succeed")  # fmt: skip
    lags = sorted(
        (a.started_at - a.scheduled_for).total_seconds()
        for a in Attempt.objects.filter(occurrence_id__in=[o.id for o in burst], attempt_no=1)
    )
    assert len(lags) == BURST
    p99 = lags[min(len(lags) - 1, int(0.99 * len(lags)))]
    assert p99 <= 5, lags
    assert "not run: delayed" not in stack.log_text("live")
    assert not DispatchOutbox.objects.filter(tenant_id=tenant_a.id, lane=Lane.RETRY).exists()


# --- strict capacity reserved from recovery work ------------------------------------------


def _recovery(tenant: Tenant, name: str) -> Occurrence:
    occ = occurrence(schedule(tenant, name=name), timezone.now())
    Occurrence.objects.filter(id=occ.id).update(lane=Lane.CATCHUP)
    return occ


@pytest.mark.django_db
def test_recovery_work_leaves_the_reserved_slots_to_on_time_runs(tenant_a, tenant_b, settings):
    # given: 4 live slots, half reserved for on-time runs; tenant a's catch-up holds 2
    settings.TICK_STRICT_RESERVED_SHARE = 0.5
    _worker("w@host", 4)
    now = timezone.now()
    for i in range(2):
        assert _claim(_recovery(tenant_a, f"c{i}"), now).status == ClaimStatus.CLAIMED
    contention_forget()
    before = REGISTRY.get_sample_value("tick_strict_reserve_delayed_total") or 0.0

    # when: more recovery work (another catch-up, another tenant's retry) and an on-time run
    more = _recovery(tenant_a, "c2")
    retry = occurrence(schedule(tenant_b, name="retry"), now)
    Occurrence.objects.filter(id=retry.id).update(attempt_count=1)
    on_time = occurrence(schedule(tenant_b, name="strict"), now)

    # then: the recovery claims are deferred, the on-time run takes a reserved slot
    assert _claim(more, now).status == ClaimStatus.DELAYED
    assert _claim(retry, now).status == ClaimStatus.DELAYED
    assert _claim(on_time, now).status == ClaimStatus.CLAIMED
    after = REGISTRY.get_sample_value("tick_strict_reserve_delayed_total") or 0.0
    assert after - before == 2


@pytest.mark.django_db
def test_each_worker_keeps_its_share_of_slots_for_on_time_runs(tenant_a, tenant_b, settings):
    # given: two live workers of 2 slots (4 in all, half reserved for on-time runs); one
    # catch-up run holds a slot of w1. A worker takes messages from every lane queue before
    # a slot is free (prefetch), so a worker whose slots all ran recovery work would keep
    # the on-time messages it already took waiting beside w2's free slots.
    settings.TICK_STRICT_RESERVED_SHARE = 0.5
    _worker("w1@host", 2)
    _worker("w2@host", 2)
    now = timezone.now()

    def claim_on(worker_id: str, occ: Occurrence) -> ClaimStatus:
        return occurrence_claim(
            occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id=worker_id, now=now
        ).status

    assert claim_on("w1@host:11", _recovery(tenant_a, "c0")) == ClaimStatus.CLAIMED
    before = REGISTRY.get_sample_value("tick_strict_reserve_delayed_total") or 0.0

    # when: w1 is handed another recovery run (1 of the 2 recovery slots is still free in
    # all), then an on-time run; w2 is handed a recovery run
    second_on_w1 = claim_on("w1@host:12", _recovery(tenant_a, "c1"))
    on_time_on_w1 = claim_on("w1@host:12", occurrence(schedule(tenant_b, name="t"), now))
    on_w2 = claim_on("w2@host:21", _recovery(tenant_a, "c2"))

    # then: w1 keeps its other slot for on-time work; w2 takes the recovery run
    assert second_on_w1 == ClaimStatus.DELAYED
    assert on_time_on_w1 == ClaimStatus.CLAIMED
    assert on_w2 == ClaimStatus.CLAIMED
    after = REGISTRY.get_sample_value("tick_strict_reserve_delayed_total") or 0.0
    assert after - before == 1


@pytest.mark.parametrize(("reserve", "error_ids"), [(0.5, []), (0.0, []), (1.0, ["tick.E017"])])
def test_the_strict_reserve_is_a_fraction_below_one(settings, reserve, error_ids):
    settings.TICK_STRICT_RESERVED_SHARE = reserve
    assert [e.id for e in check_fair_share() if e.id == "tick.E017"] == error_ids


@pytest.mark.django_db
def test_on_time_work_is_not_held_to_a_share_by_recovery_work(tenant_a, tenant_b, settings):
    # given: 4 live slots; tenant b has only recovery work waiting (catch-up, deferred by the
    # strict reserve); tenant a already runs 2 on-time runs and 1 catch-up run
    settings.TICK_STRICT_RESERVED_SHARE = 0.5
    _worker("w@host", 4)
    now = timezone.now()
    assert _claim(_recovery(tenant_a, "ca"), now).status == ClaimStatus.CLAIMED
    assert _claims_of(tenant_a, 2, now) == [ClaimStatus.CLAIMED] * 2
    waiting = _waiting(tenant_b, 3)
    Occurrence.objects.filter(id__in=[o.id for o in waiting]).update(lane=Lane.CATCHUP)
    contention_forget()

    # when: tenant a's next on-time run is claimed, then another catch-up run of its own
    on_time = _claim(occurrence(schedule(tenant_a, name="t3"), now), now)
    recovery = _claim(_recovery(tenant_a, "cb"), now)

    # then: the on-time run takes the free slot (b's recovery work cannot use it); the
    # recovery run answers to everything waiting and is held
    assert on_time.status == ClaimStatus.CLAIMED
    assert recovery.status == ClaimStatus.DELAYED


@pytest.mark.django_db
def test_an_on_time_claim_counts_only_its_tenants_on_time_runs(tenant_a, tenant_b, settings):
    # given: 4 live slots; tenant a runs 2 catch-up runs (all recovery may hold) and 1
    # on-time run; tenant b has on-time work waiting
    settings.TICK_STRICT_RESERVED_SHARE = 0.5
    _worker("w@host", 4)
    now = timezone.now()
    for name in ("c0", "c1"):
        assert _claim(_recovery(tenant_a, name), now).status == ClaimStatus.CLAIMED
    assert _claims_of(tenant_a, 1, now) == [ClaimStatus.CLAIMED]
    _waiting(tenant_b, 5)

    # when/then: its own recovery runs do not eat a's on-time share (2 of 4 with b waiting)
    assert _claim(occurrence(schedule(tenant_a, name="t1"), now), now).status == (
        ClaimStatus.CLAIMED
    )
    contention_forget()
    assert _claim(occurrence(schedule(tenant_a, name="t2"), now), now).status == (
        ClaimStatus.DELAYED
    )


@pytest.mark.django_db
def test_the_contention_snapshot_reads_a_bounded_number_of_rows(tenant_a, tenant_b, monkeypatch):
    # given: a backlog far beyond the row bound, tenant a's older than tenant b's
    monkeypatch.setattr(presence, "CONTENTION_ROWS", 20)
    _worker("w@host", 4)
    _waiting(tenant_a, 30)
    _waiting(tenant_b, 5)  # due a moment later

    # when
    with CaptureQueriesContext(connection) as queries:
        found = presence.contention()

    # then: one query; a's waiting count stops at the capacity (a larger demand shares the
    # same max-min allocation); b, younger than the bound's oldest rows, is not seen yet
    assert len([q for q in queries if "occurrences_occurrence" in q["sql"]]) == 1
    assert found.waiting == {tenant_a.id: 4}
    assert found.waiting_on_time == {tenant_a.id: 4}
    assert fair_limit(tenant_b.id, 4, found) == 2
