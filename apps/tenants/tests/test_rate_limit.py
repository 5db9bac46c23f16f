"""The tenant's API request rate through `api_rate_hit`, against the real database: a fixed
minute window per tenant (all its keys together), counted in PostgreSQL so every web process
shares one count."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from apps.tenants.models import ApiRateWindow, Tenant
from apps.tenants.services import RateDecision, api_rate_hit
from apps.tenants.tests.races import run_at_once

pytestmark = [pytest.mark.django_db, pytest.mark.clock_edge]

# A window boundary: 12:00:00 UTC is a multiple of 60 s since the epoch.
WINDOW = datetime(2030, 6, 1, 12, 0, tzinfo=UTC)


def _hits(tenant: Tenant, n: int, *, limit: int, now: datetime) -> list[RateDecision]:
    return [api_rate_hit(tenant=tenant, limit_per_min=limit, now=now) for _ in range(n)]


@pytest.fixture
def key(tenant_a):
    """The tenant whose requests are counted (named for the tests' first reading)."""
    return tenant_a


def test_requests_up_to_the_limit_are_allowed_and_later_ones_refused_and_counted(key):
    decisions = _hits(key, 5, limit=3, now=WINDOW + timedelta(seconds=10))

    assert [d.allowed for d in decisions] == [True, True, True, False, False]
    assert [d.count for d in decisions] == [1, 2, 3, 4, 5]
    assert {d.limit for d in decisions} == {3}


@pytest.mark.parametrize(
    ("offset", "retry_after"),
    [(timedelta(0), 60), (timedelta(seconds=15), 45), (timedelta(seconds=59.9), 1)],
)
def test_retry_after_is_the_whole_seconds_left_in_the_window(key, offset, retry_after):
    decision = api_rate_hit(tenant=key, limit_per_min=1, now=WINDOW + offset)

    assert decision.retry_after_s == retry_after


def test_the_last_second_of_a_window_still_counts_in_it(key):
    _hits(key, 3, limit=3, now=WINDOW)

    last = api_rate_hit(tenant=key, limit_per_min=3, now=WINDOW + timedelta(seconds=59))

    assert (last.allowed, last.count) == (False, 4)


def test_the_next_window_starts_a_new_count(key):
    _hits(key, 4, limit=3, now=WINDOW + timedelta(seconds=30))

    next_window = _hits(key, 3, limit=3, now=WINDOW + timedelta(seconds=60))

    assert [(d.allowed, d.count) for d in next_window] == [(True, 1), (True, 2), (True, 3)]


def test_windows_are_aligned_to_the_minute_not_to_the_first_request(key):
    _hits(key, 2, limit=2, now=WINDOW + timedelta(seconds=50))

    twenty_seconds_later = api_rate_hit(
        tenant=key, limit_per_min=2, now=WINDOW + timedelta(seconds=70)
    )

    assert (twenty_seconds_later.allowed, twenty_seconds_later.count) == (True, 1)


def test_the_limit_is_per_tenant_not_per_key(tenant_b, key):
    _hits(key, 3, limit=2, now=WINDOW)

    other_tenant = api_rate_hit(tenant=tenant_b, limit_per_min=2, now=WINDOW)
    same_tenant = api_rate_hit(tenant=key, limit_per_min=2, now=WINDOW)

    assert (other_tenant.allowed, other_tenant.count) == (True, 1)
    assert (same_tenant.allowed, same_tenant.count) == (False, 4)


def test_each_tenant_keeps_one_row_across_windows(key):
    for minute in range(3):
        _hits(key, 2, limit=10, now=WINDOW + timedelta(minutes=minute))

    row = ApiRateWindow.objects.get(tenant=key)
    assert ApiRateWindow.objects.count() == 1
    assert (row.window_start, row.count) == (WINDOW + timedelta(minutes=2), 2)


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_from_separate_connections_lose_no_count(key):
    n = 8

    counts = run_at_once(n, lambda i: api_rate_hit(tenant=key, limit_per_min=5, now=WINDOW).count)

    assert all(isinstance(count, int) for count in counts), counts
    assert sorted(c for c in counts if isinstance(c, int)) == list(range(1, n + 1))
    assert ApiRateWindow.objects.get(tenant=key).count == n
