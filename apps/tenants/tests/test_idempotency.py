"""Idempotency keys through the tenants services, against the real database: replay, conflict,
expiry and purge, tenant isolation, and one winner when two connections use a key at once."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.tenants.errors import IdempotencyConflict
from apps.tenants.models import IdempotencyKey, Tenant
from apps.tenants.services import (
    IdempotentResponse,
    idempotency_lookup,
    idempotency_purge,
    idempotency_request_hash,
    idempotent_call,
)
from apps.tenants.tests.races import run_at_once

BODY = {"name": "nightly", "expression": "0 3 * * *"}
HASH = idempotency_request_hash(method="POST", path="/api/v1/schedules", data=BODY)
OTHER_HASH = idempotency_request_hash(
    method="POST", path="/api/v1/schedules", data={**BODY, "name": "other"}
)


class CountingCall:
    """A stand-in for the guarded operation: counts its runs, answers (201, {"run": n})."""

    def __init__(self, *, hold_s: float = 0.0) -> None:
        self.runs = 0
        self.hold_s = hold_s
        self._lock = threading.Lock()

    def __call__(self) -> tuple[int, Any]:
        with self._lock:
            self.runs += 1
            run = self.runs
        time.sleep(self.hold_s)
        return 201, {"run": run}


def _refuse() -> tuple[int, Any]:
    raise ValueError("refused by validation")


pytestmark = pytest.mark.django_db


class TestRequestHash:
    def test_key_order_and_spacing_do_not_count(self):
        reordered = {"expression": "0 3 * * *", "name": "nightly"}

        again = idempotency_request_hash(method="POST", path="/api/v1/schedules", data=reordered)

        assert again == HASH

    def test_method_path_and_body_each_count(self):
        hashes = {
            HASH,
            OTHER_HASH,
            idempotency_request_hash(method="PUT", path="/api/v1/schedules", data=BODY),
            idempotency_request_hash(method="POST", path="/api/v1/other", data=BODY),
        }

        assert len(hashes) == 4


def test_first_use_runs_the_call_and_stores_its_response(tenant_a):
    call = CountingCall()

    result = idempotent_call(tenant=tenant_a, key="k1", request_hash=HASH, call=call)

    assert result == IdempotentResponse(201, {"run": 1}, replayed=False)
    row = IdempotencyKey.objects.get(tenant=tenant_a, key="k1")
    assert (row.request_hash, row.status_code, row.response) == (HASH, 201, {"run": 1})


def test_same_key_same_body_replays_the_first_response_without_running_again(tenant_a):
    call = CountingCall()
    idempotent_call(tenant=tenant_a, key="k1", request_hash=HASH, call=call)

    again = idempotent_call(tenant=tenant_a, key="k1", request_hash=HASH, call=call)
    looked_up = idempotency_lookup(tenant=tenant_a, key="k1", request_hash=HASH, now=timezone.now())

    assert call.runs == 1
    assert again == IdempotentResponse(201, {"run": 1}, replayed=True)
    assert looked_up == IdempotentResponse(201, {"run": 1}, replayed=True)


def test_same_key_other_body_conflicts_and_keeps_the_first_response(tenant_a):
    call = CountingCall()
    idempotent_call(tenant=tenant_a, key="k1", request_hash=HASH, call=call)

    with pytest.raises(IdempotencyConflict) as conflict:
        idempotent_call(tenant=tenant_a, key="k1", request_hash=OTHER_HASH, call=call)
    with pytest.raises(IdempotencyConflict):
        idempotency_lookup(tenant=tenant_a, key="k1", request_hash=OTHER_HASH, now=timezone.now())

    assert call.runs == 1
    assert (conflict.value.status, conflict.value.code) == (409, "idempotency_key_reused")
    assert conflict.value.field == "Idempotency-Key"
    row = IdempotencyKey.objects.get(tenant=tenant_a, key="k1")
    assert (row.request_hash, row.response) == (HASH, {"run": 1})


def test_unknown_key_looks_up_as_none(tenant_a):
    found = idempotency_lookup(tenant=tenant_a, key="new", request_hash=HASH, now=timezone.now())

    assert found is None


def test_a_refused_call_stores_nothing_and_leaves_the_key_usable(tenant_a):
    with pytest.raises(ValueError, match="refused"):
        idempotent_call(tenant=tenant_a, key="k1", request_hash=HASH, call=_refuse)

    found = idempotency_lookup(tenant=tenant_a, key="k1", request_hash=HASH, now=timezone.now())
    assert found is None
    # Even another body may use the key: the refused request did not spend it.
    call = CountingCall()
    result = idempotent_call(tenant=tenant_a, key="k1", request_hash=OTHER_HASH, call=call)
    assert result == IdempotentResponse(201, {"run": 1}, replayed=False)
    assert IdempotencyKey.objects.get(tenant=tenant_a, key="k1").request_hash == OTHER_HASH


def test_a_key_is_honoured_for_exactly_the_ttl(tenant_a, settings):
    idempotent_call(tenant=tenant_a, key="k1", request_hash=HASH, call=CountingCall())
    created_at = IdempotencyKey.objects.get(tenant=tenant_a, key="k1").created_at
    ttl = timedelta(seconds=settings.TICK_IDEMPOTENCY_TTL_S)

    at_ttl = idempotency_lookup(tenant=tenant_a, key="k1", request_hash=HASH, now=created_at + ttl)
    after = idempotency_lookup(
        tenant=tenant_a, key="k1", request_hash=HASH, now=created_at + ttl + timedelta(seconds=1)
    )

    assert at_ttl is not None and at_ttl.replayed
    assert after is None


def test_an_expired_key_runs_the_call_again_even_for_another_body(tenant_a, settings):
    first = CountingCall()
    idempotent_call(tenant=tenant_a, key="k1", request_hash=HASH, call=first)
    expired = timezone.now() - timedelta(seconds=settings.TICK_IDEMPOTENCY_TTL_S + 1)
    IdempotencyKey.objects.filter(tenant=tenant_a, key="k1").update(created_at=expired)

    second = CountingCall()
    result = idempotent_call(tenant=tenant_a, key="k1", request_hash=OTHER_HASH, call=second)

    assert (first.runs, second.runs) == (1, 1)
    assert result == IdempotentResponse(201, {"run": 1}, replayed=False)
    row = IdempotencyKey.objects.get(tenant=tenant_a, key="k1")
    assert row.request_hash == OTHER_HASH and row.created_at > expired


def test_purge_deletes_expired_rows_oldest_first_up_to_the_limit(tenant_a, settings):
    now = datetime(2030, 6, 1, 12, 0, tzinfo=UTC)
    ttl = timedelta(seconds=settings.TICK_IDEMPOTENCY_TTL_S)
    ages = {"oldest": ttl * 3, "older": ttl * 2, "old": ttl + timedelta(seconds=1), "fresh": ttl}
    for key, age in ages.items():
        IdempotencyKey.objects.create(
            tenant=tenant_a, key=key, request_hash=HASH, status_code=201, created_at=now - age
        )

    first = idempotency_purge(now=now, limit=2)
    left_after_first = set(IdempotencyKey.objects.values_list("key", flat=True))
    second = idempotency_purge(now=now, limit=2)

    assert first == 2
    assert left_after_first == {"old", "fresh"}
    assert second == 1
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["fresh"]


def test_keys_are_per_tenant(tenant_a, tenant_b):
    call_a, call_b = CountingCall(), CountingCall()
    idempotent_call(tenant=tenant_a, key="shared", request_hash=HASH, call=call_a)

    before_b = idempotency_lookup(
        tenant=tenant_b, key="shared", request_hash=OTHER_HASH, now=timezone.now()
    )
    result_b = idempotent_call(tenant=tenant_b, key="shared", request_hash=OTHER_HASH, call=call_b)

    assert before_b is None
    assert (call_a.runs, call_b.runs) == (1, 1)
    assert result_b.replayed is False
    replay_a = idempotent_call(tenant=tenant_a, key="shared", request_hash=HASH, call=call_a)
    assert replay_a == IdempotentResponse(201, {"run": 1}, replayed=True)
    assert IdempotencyKey.objects.filter(key="shared").count() == 2


# --- concurrent first use: separate threads, separate connections, real row locks ---------


def _use_key_at_once(tenant: Tenant, hashes: list[str], call: CountingCall) -> list[Any]:
    """Each thread calls idempotent_call with its own hash; all are released together."""
    return run_at_once(
        len(hashes),
        lambda i: idempotent_call(tenant=tenant, key="race", request_hash=hashes[i], call=call),
    )


@pytest.mark.django_db(transaction=True)
def test_concurrent_first_use_with_one_body_runs_the_call_once(tenant_a):
    # The winner holds the row lock while its call runs, so the loser must wait on it.
    call = CountingCall(hold_s=0.3)

    results = _use_key_at_once(tenant_a, [HASH, HASH], call)

    assert call.runs == 1
    assert all(isinstance(r, IdempotentResponse) for r in results), results
    assert sorted(r.replayed for r in results) == [False, True]
    assert [r.body for r in results] == [{"run": 1}, {"run": 1}]
    assert IdempotencyKey.objects.filter(tenant=tenant_a, key="race").count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_first_use_with_two_bodies_has_one_winner_and_one_conflict(tenant_a):
    call = CountingCall(hold_s=0.3)

    results = _use_key_at_once(tenant_a, [HASH, OTHER_HASH], call)

    assert call.runs == 1
    winners = [r for r in results if isinstance(r, IdempotentResponse)]
    conflicts = [r for r in results if isinstance(r, IdempotencyConflict)]
    assert (len(winners), len(conflicts)) == (1, 1), results
    assert winners[0] == IdempotentResponse(201, {"run": 1}, replayed=False)
    winner_hash = HASH if results[0] is winners[0] else OTHER_HASH
    assert IdempotencyKey.objects.get(tenant=tenant_a, key="race").request_hash == winner_hash
