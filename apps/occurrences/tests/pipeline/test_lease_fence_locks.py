"""The fence's lock and the lease writes, on the real database with two connections: a
renewal of the expiry passes a fenced transaction in flight (the heartbeat must not wait for
its own process's read), every change of hands waits for it (or, taking over, passes the
shard by until it ends), and fencing stays exact (docs/decisions.md "Renewals pass the fence,
changes of hands wait")."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction

from apps.occurrences.models import ShardLease
from apps.occurrences.pipeline.leases import LeaseSet, relay_shard_barrier

pytestmark = pytest.mark.django_db(transaction=True)  # two connections

SHARDS = 8
TTL_S = 30


def _leases(owner: str) -> LeaseSet:
    lease_set = LeaseSet(role=ShardLease.Role.RELAY, owner=owner, shards_total=SHARDS, ttl_s=TTL_S)
    lease_set.refresh()
    return lease_set


class _OnItsOwnConnection(threading.Thread):
    """Runs `work` on this thread's own database connection (lock_timeout 20 s, so a wait
    that should not happen fails instead of hanging); keeps its backend pid and outcome."""

    def __init__(self, work: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.work = work
        self.pid: int | None = None
        self.started_work = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = '20s'")
                cursor.execute("SELECT pg_backend_pid()")
                self.pid = cursor.fetchone()[0]
            self.started_work.set()
            self.result = self.work()
        except BaseException as exc:  # noqa: BLE001 - reported by `outcome`
            self.error = exc
        finally:
            connection.close()

    def outcome(self, timeout: float = 30) -> Any:
        self.join(timeout)
        assert not self.is_alive(), "still waiting"
        if self.error is not None:
            raise self.error
        return self.result


def _my_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def _blocked_by(waiter: _OnItsOwnConnection, holder_pid: int, timeout: float = 20) -> bool:
    """Whether `waiter`'s statement comes to wait for a lock `holder_pid` holds."""
    assert waiter.started_work.wait(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and waiter.is_alive():
        with connection.cursor() as cursor:
            cursor.execute("SELECT %s = ANY(pg_blocking_pids(%s))", [holder_pid, waiter.pid])
            if cursor.fetchone()[0]:
                return True
        time.sleep(0.05)
    return False


def _expiries(owner: str) -> dict[int, Any]:
    return dict(
        ShardLease.objects.filter(role=ShardLease.Role.RELAY, owner=owner).values_list(
            "shard", "lease_expires_at"
        )
    )


def test_a_renewal_completes_while_a_fenced_read_of_the_same_leases_is_open():
    relay = _leases("relay")
    before = _expiries("relay")
    with transaction.atomic():
        assert relay.fenced_shards() == list(range(SHARDS))
        heartbeat = _OnItsOwnConnection(relay.extend)
        heartbeat.start()
        # The fenced read is still open: the renewal did not wait for it.
        assert heartbeat.outcome() == SHARDS
    after = _expiries("relay")
    assert all(after[shard] > before[shard] for shard in before)


def test_a_release_waits_for_the_fenced_read_in_flight():
    relay = _leases("relay")
    with transaction.atomic():
        assert relay.fenced_shards()
        release = _OnItsOwnConnection(relay.release)
        release.start()
        assert _blocked_by(release, _my_pid())
        # Still held while the fenced read is open.
        assert set(relay.fenced_shards()) == set(range(SHARDS))
    release.outcome()
    assert not ShardLease.objects.filter(role=ShardLease.Role.RELAY, owner="relay").exists()


def test_a_recall_barrier_waits_for_the_fenced_read_in_flight():
    relay = _leases("relay")
    with transaction.atomic():
        assert relay.fenced_shards()
        barrier = _OnItsOwnConnection(lambda: relay_shard_barrier(3))
        barrier.start()
        assert _blocked_by(barrier, _my_pid())
    barrier.outcome()
    assert ShardLease.objects.get(role=ShardLease.Role.RELAY, shard=3).recalls == 1


def test_a_takeover_waits_until_the_fenced_read_ends_and_the_stale_owner_then_writes_nothing():
    stale = _leases("stale")
    with transaction.atomic(), connection.cursor() as cursor:
        assert stale.fenced_shards() == list(range(SHARDS))
        # The stale owner froze: its leases expire while its fenced read is open.
        expire = _OnItsOwnConnection(
            lambda: ShardLease.objects.filter(owner="stale").update(lease_expires_at=None)
        )
        expire.start()
        assert expire.outcome() == SHARDS
        fresh = _OnItsOwnConnection(lambda: _leases("fresh").held)
        fresh.start()
        # Nothing changes hands while the read is open: every shard is passed by.
        assert fresh.outcome() == {}
        # Work under the fence it took still sees the shards as its own.
        cursor.execute(
            "SELECT count(*) FROM occurrences_shardlease WHERE role = %s AND owner = 'stale'",
            [ShardLease.Role.RELAY],
        )
        assert cursor.fetchone()[0] == SHARDS

    taken = _leases("fresh").held
    assert len(taken) == SHARDS // 2  # a fair share, now taken over at a new generation
    assert all(generation == stale.held[shard] + 1 for shard, generation in taken.items())
    # The stale owner's next fenced work finds none of them.
    with transaction.atomic():
        assert stale.fenced_shards() == []
