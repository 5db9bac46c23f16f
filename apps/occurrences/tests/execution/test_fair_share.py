"""Fair share of worker slots: the capacity the live workers announce, and claims beyond a
tenant's share of it delayed through the outbox while another tenant contends (a tenant alone
may use every slot) — against the real database, and end to end with a real relay, RabbitMQ
and a Celery worker."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client import REGISTRY

from apps.occurrences.execution.claim import ClaimStatus, occurrence_claim
from apps.occurrences.execution.complete import attempt_complete
from apps.occurrences.execution.presence import (
    ACTIVITY_LAG_S,
    ACTIVITY_WRITE_EVERY_S,
    capacity_forget,
    contention_forget,
    live_capacity,
    presence_beat,
    presence_leave,
    tenant_slot_limit,
)
from apps.occurrences.models import (
    Attempt,
    DispatchOutbox,
    Lane,
    Occurrence,
    TenantActivity,
    WorkerPresence,
)
from apps.occurrences.tests.support.processes import ProcessStack, shared_stack_env
from apps.occurrences.tests.support.rows import occurrence, schedule, state_of
from apps.tenants.models import Tenant
from apps.tenants.tests.races import run_at_once
from tickweb.checks import check_fair_share, check_value_ranges


@pytest.fixture(autouse=True)
def _share_of_half(settings) -> None:
    # The figures below assume these (the defaults); the root conftest forgets the cache.
    settings.TICK_TENANT_SLOT_SHARE, settings.TICK_WORKER_SLOTS = 0.5, 0
    settings.TICK_WORKER_PRESENCE_TTL_S = 30
    settings.TICK_FAIR_SHARE_WINDOW_S = 60


WINDOW_S = 60


def _worker(hostname: str, slots: int, *, seen_s_ago: float = 0) -> None:
    WorkerPresence.objects.create(
        hostname=hostname, slots=slots, seen_at=timezone.now() - timedelta(seconds=seen_s_ago)
    )


def _claim(occ: Occurrence, now: datetime):
    return occurrence_claim(
        occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w", now=now
    )


def _fair_share_delays() -> float:
    return REGISTRY.get_sample_value("tick_fair_share_delayed_total") or 0.0


def _started(tenant: Tenant, *, s_ago: float = 0) -> None:
    """The tenant started an attempt `s_ago` seconds ago (by the database clock), as a claim
    records it; this process's cached contention answer is forgotten."""
    TenantActivity.objects.update_or_create(
        tenant_id=tenant.id,
        defaults={"last_started_at": _db_now() - timedelta(seconds=s_ago)},
    )
    contention_forget()


def _db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        (now,) = cursor.fetchone()
    assert isinstance(now, datetime)
    return now


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
def test_the_contention_window_must_be_positive(settings, window_s, error_ids):
    settings.TICK_FAIR_SHARE_WINDOW_S = window_s

    messages = [m for m in check_value_ranges() if "TICK_FAIR_SHARE_WINDOW_S" in m.msg]
    assert [message.id for message in messages] == error_ids


# --- claims -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_over_share_claims_are_deferred_not_dropped_and_run_once_slots_free_up(tenant_a, tenant_b):
    # given: 4 live slots (share 2 per tenant), another tenant that ran a moment ago, a tenant
    # allowed 100, and 5 due at once
    _worker("w@host", 4)
    _started(tenant_b, s_ago=10)
    now = timezone.now()
    occs = [occurrence(schedule(tenant_a, name=f"s{i}"), now) for i in range(5)]
    delays_before = _fair_share_delays()

    # when: 5 workers claim at the same moment
    claims = run_at_once(len(occs), lambda i: _claim(occs[i], now))

    # then: 2 run; 3 wait in the retry lane 2-4 s later, still ENQUEUED, counted as share
    statuses = [c.status for c in claims]
    assert statuses.count(ClaimStatus.CLAIMED) == 2
    assert statuses.count(ClaimStatus.DELAYED) == 3
    delayed = DispatchOutbox.objects.filter(tenant_id=tenant_a.id)
    assert delayed.count() == 3 and {d.lane for d in delayed} == {Lane.RETRY}
    assert all(now + timedelta(seconds=2) <= d.available_at <= now + timedelta(seconds=4)
               for d in delayed)  # fmt: skip
    waiting = [o for o, s in zip(occs, statuses, strict=True) if s == ClaimStatus.DELAYED]
    assert [state_of(o) for o in waiting] == ["ENQUEUED"] * 3
    assert _fair_share_delays() - delays_before == 3

    # when: the two running ones finish and the delayed ones come back
    for claim in (c for c in claims if c.status == ClaimStatus.CLAIMED):
        attempt_complete(claim=claim, now=now + timedelta(seconds=1))
    later = now + timedelta(seconds=4)
    second = [_claim(o, later) for o in waiting]

    # then: two more run, the third is delayed again; once those end it runs too
    assert [c.status for c in second].count(ClaimStatus.CLAIMED) == 2
    for claim in (c for c in second if c.status == ClaimStatus.CLAIMED):
        attempt_complete(claim=claim, now=later + timedelta(seconds=1))
    last = next(o for o, c in zip(waiting, second, strict=True) if c.status != ClaimStatus.CLAIMED)
    assert _claim(last, later + timedelta(seconds=4)).status == ClaimStatus.CLAIMED
    assert Attempt.objects.filter(tenant=tenant_a).count() == 5
    assert sorted(state_of(o) for o in occs) == ["RUNNING"] + ["SUCCEEDED"] * 4


@pytest.mark.django_db
def test_a_long_deferred_occurrence_asks_again_less_often_up_to_a_cap(tenant_a, tenant_b):
    # given: tenant a at its share of 2 while b contends, and three more of a's occurrences
    # that have waited since their first publish 1 s, 40 s and 10 min
    _worker("w@host", 4)
    _started(tenant_b, s_ago=10)
    now = timezone.now()
    assert _claims_of(tenant_a, 2, now) == [ClaimStatus.CLAIMED] * 2
    waited: dict[int, float] = {}
    for seconds in (1, 40, 600):
        occ = occurrence(schedule(tenant_a, name=f"waited{seconds}"), now)
        Occurrence.objects.filter(id=occ.id).update(enqueued_at=now - timedelta(seconds=seconds))
        assert _claim(occ, now).status == ClaimStatus.DELAYED
        row = DispatchOutbox.objects.get(occurrence_id=occ.id)
        waited[seconds] = (row.available_at - now).total_seconds()

    # then: a fresh one asks again in 2-4 s; one waiting 40 s in 20-30 s (half its wait,
    # jittered); none later than 30 s, however long it waited
    assert 2 <= waited[1] <= 4
    assert 20 <= waited[40] <= 30
    assert waited[600] == pytest.approx(30, abs=0.01)


@pytest.mark.django_db
def test_a_quiet_tenant_claims_while_the_noisy_one_holds_its_share(tenant_a, tenant_b):
    _worker("w@host", 4)
    _started(tenant_b, s_ago=55)  # the quiet one runs every minute
    now = timezone.now()
    noisy = [occurrence(schedule(tenant_a, name=f"n{i}"), now) for i in range(3)]
    quiet = occurrence(schedule(tenant_b, name="q"), now)

    noisy_statuses = [_claim(o, now).status for o in noisy]
    quiet_status = _claim(quiet, now).status

    assert noisy_statuses == [ClaimStatus.CLAIMED, ClaimStatus.CLAIMED, ClaimStatus.DELAYED]
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


# --- work-conserving: the share binds only while another tenant contends ------------------


@pytest.mark.django_db
def test_a_lone_tenant_uses_every_slot_beyond_its_share(tenant_a, tenant_b):
    # given: 4 live slots (share 2); the other tenant last ran longer ago than the window
    _worker("w@host", 4)
    _started(tenant_b, s_ago=WINDOW_S + ACTIVITY_LAG_S + 1)
    delays_before = _fair_share_delays()

    # when: the lone tenant has 4 due at once
    statuses = _claims_of(tenant_a, 4, timezone.now())

    # then: all 4 run, nothing is deferred, and the tenant is now on record as active
    assert statuses == [ClaimStatus.CLAIMED] * 4
    assert not DispatchOutbox.objects.exists()
    assert _fair_share_delays() == delays_before
    assert TenantActivity.objects.filter(tenant_id=tenant_a.id).exists()


def _other_started_recently(tenant: Tenant) -> None:
    _started(tenant, s_ago=WINDOW_S - 1)


def _other_still_running_a_long_run(tenant: Tenant) -> None:
    # an attempt opened long before the window, still open
    long_run = occurrence(schedule(tenant, name="long"), timezone.now())
    assert _claim(long_run, timezone.now()).status == ClaimStatus.CLAIMED
    _started(tenant, s_ago=10 * WINDOW_S)


@pytest.mark.parametrize("other_active", [_other_started_recently, _other_still_running_a_long_run])
@pytest.mark.django_db
def test_another_tenant_active_within_the_window_or_running_brings_the_share_back(
    tenant_a, tenant_b, other_active
):
    _worker("w@host", 4)
    other_active(tenant_b)
    delays_before = _fair_share_delays()

    statuses = _claims_of(tenant_a, 4, timezone.now())

    assert statuses == [ClaimStatus.CLAIMED] * 2 + [ClaimStatus.DELAYED] * 2
    assert DispatchOutbox.objects.filter(tenant_id=tenant_a.id).count() == 2
    assert _fair_share_delays() - delays_before == 2


@pytest.mark.django_db
def test_the_cap_lifts_once_the_other_tenant_has_been_quiet_for_the_window(tenant_a, tenant_b):
    # given: the noisy tenant held to its share of 2 while the other ran 10 s ago
    _worker("w@host", 4)
    _started(tenant_b, s_ago=10)
    now = timezone.now()
    assert _claims_of(tenant_a, 3, now)[-1] == ClaimStatus.DELAYED
    extra = occurrence(schedule(tenant_a, name="extra"), now)

    # when: the other's last start is just past the window — still within the few seconds
    # its record may lag a later start by — the cap holds
    _started(tenant_b, s_ago=WINDOW_S + 1)
    assert _claim(extra, now).status == ClaimStatus.DELAYED

    # when: the other has been quiet for the whole window (and has nothing running)
    _started(tenant_b, s_ago=WINDOW_S + ACTIVITY_LAG_S + 1)

    # then: the noisy tenant takes the free slots beyond its share
    assert _claim(extra, now).status == ClaimStatus.CLAIMED
    assert Attempt.objects.filter(tenant=tenant_a, finished_at__isnull=True).count() == 3


@pytest.mark.django_db
def test_a_claim_under_its_share_never_asks_whether_others_contend(tenant_a, tenant_b):
    _worker("w@host", 4)
    _started(tenant_b)
    now = timezone.now()
    occs = [occurrence(schedule(tenant_a, name=f"s{i}"), now) for i in range(4)]

    reads = []
    for occ in occs:
        with CaptureQueriesContext(connection) as queries:
            _claim(occ, now)
        reads.append(sum("FROM occurrences_tenantactivity" in q["sql"] for q in queries))

    # two under the share: no read; the third asks once; the fourth is answered from cache
    assert reads == [0, 0, 1, 0]


@pytest.mark.django_db
def test_a_tenants_activity_is_rewritten_at_most_every_few_seconds(tenant_a):
    _worker("w@host", 100)
    now = timezone.now()

    def last_started() -> datetime:
        return TenantActivity.objects.get(tenant_id=tenant_a.id).last_started_at

    # (one test transaction: the database clock stands still, so the figures are exact)
    _claims_of(tenant_a, 1, now)
    assert last_started() == _db_now()  # first start: recorded
    _started(tenant_a, s_ago=ACTIVITY_WRITE_EVERY_S - 2)
    _claim(occurrence(schedule(tenant_a, name="soon"), now), now)
    assert last_started() == _db_now() - timedelta(seconds=ACTIVITY_WRITE_EVERY_S - 2)  # kept
    _started(tenant_a, s_ago=ACTIVITY_WRITE_EVERY_S + 1)
    _claim(occurrence(schedule(tenant_a, name="later"), now), now)
    assert last_started() == _db_now()  # older than the interval: rewritten


@pytest.mark.django_db(transaction=True)
def test_a_process_sends_a_tenants_activity_at_most_every_few_seconds(tenant_a):
    _worker("w@host", 100)
    now = timezone.now()
    occs = [occurrence(schedule(tenant_a, name=f"s{i}"), now) for i in range(3)]

    def writes_sent(occ: Occurrence) -> int:
        with CaptureQueriesContext(connection) as queries:
            assert _claim(occ, now).status == ClaimStatus.CLAIMED
        return sum("INTO occurrences_tenantactivity" in q["sql"] for q in queries)

    # the first claim writes and commits; the next, a moment later, sends nothing
    assert [writes_sent(occs[0]), writes_sent(occs[1])] == [1, 0]
    # a process that has not sent it lately (here: forgotten) sends it again
    contention_forget()
    assert writes_sent(occs[2]) == 1


# --- end to end ---------------------------------------------------------------------------

SLOTS, SLEEP_S = 4, 4.0


def _due_through_the_outbox(occ: Occurrence) -> None:
    """Hand the occurrence to the relay, as the materializer does."""
    DispatchOutbox.objects.create(
        occurrence_id=occ.id, scheduled_for=occ.scheduled_for, schedule_id=occ.schedule_id,
        schedule_version=occ.schedule_version, tenant_id=occ.tenant_id,
        shard=occ.schedule.shard, lane=Lane.STRICT, available_at=occ.scheduled_for,
        created_at=timezone.now(),
    )  # fmt: skip


def _most_at_once(tenant: Tenant) -> int:
    """The most attempts of the tenant that overlapped in time."""
    edges = []
    for started, finished in Attempt.objects.filter(tenant=tenant).values_list(
        "started_at", "finished_at"
    ):
        edges += [(started, 1), (finished, -1)]
    running = most = 0
    for _, step in sorted(edges, key=lambda edge: (edge[0], edge[1])):
        running += step
        most = max(most, running)
    return most


def _wait_for(predicate, timeout_s: float, stack: ProcessStack, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        stack.assert_alive()
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def stack(queue_prefix: str, tmp_path: Path) -> Iterator[ProcessStack]:
    env = shared_stack_env(
        queue_prefix,
        TICK_TENANT_SLOT_SHARE="0.5",
        TICK_WORKER_SLOTS="0",
        TICK_FAIR_SHARE_WINDOW_S=str(WINDOW_S),
    )
    processes = ProcessStack(tmp_path, env)
    processes.start_role("relay")
    processes.start_role("worker", concurrency=SLOTS)
    yield processes
    processes.stop_all()


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_holds_a_noisy_tenant_to_its_share_and_runs_the_rest_later(
    tenant_a, tenant_b, stack
):
    # given: the worker announced its 4 slots (so each tenant's share is 2), and the quiet
    # tenant ran a moment ago through it: it contends, so the share binds the noisy one
    _wait_for(lambda: WorkerPresence.objects.filter(slots=SLOTS).exists(), 60, stack,
              "the worker's presence")  # fmt: skip
    earlier = occurrence(schedule(tenant_b, name="earlier"), timezone.now(),
                         state=Occurrence.State.SCHEDULED)  # fmt: skip
    _due_through_the_outbox(earlier)
    _wait_for(lambda: state_of(earlier) == Occurrence.State.SUCCEEDED, 30, stack,
              "the quiet tenant's earlier run")  # fmt: skip
    # when: the noisy tenant has 6 sleepers due at once, the quiet one a short run just after
    t0 = timezone.now() + timedelta(seconds=2)
    noisy = [
        occurrence(schedule(tenant_a, name=f"n{i}", payload={"sleep_s": SLEEP_S}),
                   t0 + timedelta(milliseconds=i), state=Occurrence.State.SCHEDULED)
        for i in range(6)
    ]  # fmt: skip
    quiet = occurrence(
        schedule(tenant_b, name="q"), t0 + timedelta(milliseconds=500),
        state=Occurrence.State.SCHEDULED,
    )  # fmt: skip
    for occ in [*noisy, quiet]:
        _due_through_the_outbox(occ)

    # then: every noisy occurrence runs, never more than 2 at once, and the quiet one starts
    # while the noisy tenant's sleepers still hold their slots
    done = [Occurrence.State.SUCCEEDED] * 7
    _wait_for(lambda: [state_of(o) for o in [*noisy, quiet]] == done,
              90, stack, "all seven to succeed")  # fmt: skip
    assert _most_at_once(tenant_a) == 2
    assert Attempt.objects.filter(tenant=tenant_a).count() == 6  # none dropped, none twice
    quiet_start = Attempt.objects.get(tenant=tenant_b, occurrence_id=quiet.id).started_at
    assert (quiet_start - quiet.scheduled_for).total_seconds() < SLEEP_S / 2

    # when: the worker shuts down cleanly, its slots stop counting at once
    worker = stack.procs["worker"]
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=60)
    assert not WorkerPresence.objects.exists()
