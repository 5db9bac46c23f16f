"""Shared fixtures: the tenancy trio (A's admin, a member of A, an outsider in B) and
API clients authenticated by each tenant's key."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.occurrences.execution import presence
from apps.occurrences.pipeline import partitions
from apps.tenants.models import Membership, Tenant
from apps.tenants.services import api_key_create, membership_grant, tenant_create


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--clock-edge",
        action="store_true",
        help="start every test module at 23:59:50 UTC on the last day of the month (the clock "
        "then runs on): a test that derives an instant or a budget from 'now' must still pass "
        "when the minute, hour, day, month and year turn under it (docs/testing.md)",
    )


def clock_edge_start(today: date) -> datetime:
    """23:59:50 UTC on the last day of `today`'s month: ten seconds before the minute, hour,
    day and month (in December also the year) all turn."""
    first_of_next = (today.replace(day=1) + timedelta(days=32)).replace(day=1)
    return datetime.combine(first_of_next, time(0, 0), tzinfo=UTC) - timedelta(seconds=10)


# The database's clock moves with the process's: `now()` and `clock_timestamp()` as the test
# database's search path finds them first (pg_catalog named last is searched last), real time
# plus the offset one row holds. The row is written on its own connection, so the threads'
# and workers' connections of a test see the same clock. Leases, presence, heartbeats and
# alert times judge by the database's clock on purpose (docs/testing.md).
_SHIFTED_CLOCK_SQL = """
    CREATE TABLE IF NOT EXISTS public.tick_test_clock (offset_s double precision NOT NULL);
    GRANT SELECT ON public.tick_test_clock TO PUBLIC;
    CREATE OR REPLACE FUNCTION public.now() RETURNS timestamptz LANGUAGE sql STABLE AS
      $$ SELECT pg_catalog.now()
                + make_interval(secs => coalesce((SELECT max(offset_s)
                                                  FROM public.tick_test_clock), 0)) $$;
    CREATE OR REPLACE FUNCTION public.clock_timestamp() RETURNS timestamptz LANGUAGE sql
      VOLATILE AS
      $$ SELECT pg_catalog.clock_timestamp()
                + make_interval(secs => coalesce((SELECT max(offset_s)
                                                  FROM public.tick_test_clock), 0)) $$;
"""


def _owner_connection() -> Any:
    import psycopg
    from django.db import connection

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    return psycopg.connect(**params, autocommit=True)


@pytest.fixture(scope="session", autouse=True)
def _clock_edge_database(request: pytest.FixtureRequest) -> Iterator[None]:
    # Session-wide, so that it runs before any test opens its transaction.
    if not request.config.getoption("--clock-edge"):
        yield
        return
    from django.db import connection, connections

    request.getfixturevalue("django_db_setup")
    django_db_blocker = request.getfixturevalue("django_db_blocker")
    with django_db_blocker.unblock(), _owner_connection() as conn:
        name = connection.settings_dict["NAME"]
        conn.execute(_SHIFTED_CLOCK_SQL)
        conn.execute(f'ALTER DATABASE "{name}" SET search_path = "$user", public, pg_catalog')
        connections.close_all()  # reopened with the new search path
        try:
            yield
        finally:
            conn.execute(f'ALTER DATABASE "{name}" RESET search_path')
            conn.execute("DROP FUNCTION public.now(), public.clock_timestamp()")
            conn.execute("DROP TABLE public.tick_test_clock")
            connections.close_all()


@pytest.fixture(scope="module", autouse=True)
def _clock_edge(request: pytest.FixtureRequest) -> Iterator[None]:
    # Per module: each module starts ten seconds before the month turns and runs on through
    # it, so the turn falls inside one of its tests, earlier tests run in the month's last
    # seconds and later ones in the new month's first (a whole run per test would be too
    # short to cross anything). Module-scoped, so set up before any function fixture that
    # creates rows from "now" (partitions_around_today, tenants).
    if not request.config.getoption("--clock-edge"):
        yield
        return
    import time_machine

    blocker = request.getfixturevalue("django_db_blocker")
    start = clock_edge_start(datetime.now(UTC).date())
    with blocker.unblock(), _owner_connection() as conn:
        conn.execute("DELETE FROM public.tick_test_clock")
        conn.execute(
            "INSERT INTO public.tick_test_clock VALUES "
            "(extract(epoch FROM %s::timestamptz - pg_catalog.now()))",
            [start],
        )
    with time_machine.travel(start, tick=True):
        yield


_CROSSED: list[str] = []


@pytest.fixture(autouse=True)
def _clock_edge_witness(request: pytest.FixtureRequest) -> Iterator[None]:
    # Names the tests the month turned inside (printed at the end of a --clock-edge run): the
    # proof that the run crossed the boundary, not just ran near it.
    if not request.config.getoption("--clock-edge"):
        yield
        return
    before = datetime.now(UTC)
    yield
    if datetime.now(UTC).month != before.month:
        _CROSSED.append(request.node.nodeid)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if config.getoption("--clock-edge"):
        terminalreporter.write_line(f"clock edge: the month turned inside {len(_CROSSED)} tests")
        for nodeid in _CROSSED:
            terminalreporter.write_line(f"  {nodeid}")


@pytest.fixture(scope="session", autouse=True)
def _through_pgbouncer(request: pytest.FixtureRequest) -> Iterator[None]:
    """TICK_TEST_PGBOUNCER=1 (`make pytest` runs the pooler suite so): every connection of
    the run reaches the test database through a private PgBouncer in transaction mode, as
    the web and the workers do in production (docs/operations.md "PgBouncer")."""
    if not os.environ.get("TICK_TEST_PGBOUNCER"):
        yield
        return
    request.getfixturevalue("django_db_setup")
    from tickweb.pgbouncer import django_through_pgbouncer

    with django_through_pgbouncer(pool_size=4):
        yield


@pytest.fixture(autouse=True)
def _forget_partitions() -> Iterator[None]:
    # Test transactions roll back partition DDL too; the per-process cache must not lie.
    partitions.partitions_forget()
    yield
    partitions.partitions_forget()


@pytest.fixture(autouse=True)
def _forget_presence_caches() -> Iterator[None]:
    # Workers' presence and tenants' activity rows come and go with each test; the
    # per-process caches must not carry one test's capacity or contention into the next.
    presence.capacity_forget()
    presence.contention_forget()
    yield
    presence.capacity_forget()
    presence.contention_forget()


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium for the web UI's browser tests (apps/tenants/tests/browser.py)."""
    from apps.tenants.tests.browser import chromium_driver

    with chromium_driver() as driver:
        yield driver


@pytest.fixture
def partitions_around_today(db: Any) -> None:
    """Yesterday's, today's and tomorrow's occurrence partitions, as the materializer keeps
    them: a web request (the restricted role) may not create tables."""
    today = datetime.now(UTC).date()
    partitions.partitions_ensure([today - timedelta(days=1), today, today + timedelta(days=1)])


@pytest.fixture
def tenant_a(db: Any) -> Tenant:
    return tenant_create(slug="alpha", name="Alpha")


@pytest.fixture
def tenant_b(db: Any) -> Tenant:
    return tenant_create(slug="bravo", name="Bravo")


@pytest.fixture
def alice(tenant_a: Tenant, django_user_model: Any) -> Any:
    user = django_user_model.objects.create_user("alice", password="pw-alice-123")
    membership_grant(user=user, tenant=tenant_a, role=Membership.Role.ADMIN)
    return user


@pytest.fixture
def bob(tenant_a: Tenant, django_user_model: Any) -> Any:
    user = django_user_model.objects.create_user("bob", password="pw-bob-123")
    membership_grant(user=user, tenant=tenant_a, role=Membership.Role.VIEWER)
    return user


@pytest.fixture
def charlie(tenant_b: Tenant, django_user_model: Any) -> Any:
    user = django_user_model.objects.create_user("charlie", password="pw-charlie-123")
    membership_grant(user=user, tenant=tenant_b, role=Membership.Role.ADMIN)
    return user


def _client_for(tenant: Tenant) -> APIClient:
    _, raw = api_key_create(actor="test", tenant=tenant, name="test")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.fixture
def api_a(tenant_a: Tenant) -> APIClient:
    return _client_for(tenant_a)


@pytest.fixture
def api_b(tenant_b: Tenant) -> APIClient:
    return _client_for(tenant_b)


@pytest.fixture
def queue_prefix(settings: Any) -> Iterator[str]:
    """A private RabbitMQ topology per test, so a running `make run` stack never sees it."""
    from apps.occurrences.pipeline.broker import Publisher

    prefix = f"tick-test-{uuid.uuid4().hex[:10]}"
    settings.TICK_QUEUE_PREFIX = prefix
    yield prefix
    publisher = Publisher(
        settings.CELERY_BROKER_URL, prefix=prefix, partitions=settings.TICK_TENANT_PARTITIONS,
        celery_app=None,
    )  # fmt: skip
    publisher.delete_topology()
    publisher.close()


@pytest.fixture
def publisher(queue_prefix: str) -> Iterator[Any]:
    """A connected relay publisher on the test's private topology."""
    from django.conf import settings

    from apps.occurrences.pipeline.broker import Publisher
    from tickweb.celery import app as celery_app

    pub = Publisher(
        settings.CELERY_BROKER_URL,
        prefix=queue_prefix,
        partitions=settings.TICK_TENANT_PARTITIONS,
        celery_app=celery_app,
    )
    pub.connect()
    yield pub
    pub.close()
