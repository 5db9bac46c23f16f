"""A tenant never leaks through a pool (apps/tenants/rls.py: the row-level-security settings
are transaction-local). Two tenants' requests, web and API, run interleaved on one server
connection — PgBouncer in transaction mode with a pool of one, and Django's persistent
connection directly — including requests that fail in the middle of a transaction; every
read, made without any tenant filter, sees its own tenant's rows and nothing else."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from apps.occurrences.tests.support.rows import occurrence, schedule
from apps.tenants.models import Tenant
from apps.tenants.services import api_key_create
from tickweb.pgbouncer import PrivatePgBouncer, django_through_pgbouncer

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("apps.tenants.tests.pooler_probe"),
]

ROUNDS = 4


@pytest.fixture
def rows(tenant_a: Tenant, tenant_b: Tenant, settings: Any) -> None:
    settings.DEBUG = False  # a failed request's 500 page, not the slow technical one
    when = timezone.now().replace(second=0, microsecond=0)
    for tenant in (tenant_a, tenant_b):
        occurrence(schedule(tenant, name=f"{tenant.slug}'s"), when)


@pytest.fixture
def pool_of_one(rows: None) -> Iterator[PrivatePgBouncer]:
    """Every connection of the test (each thread's, the test body's) goes through a private
    PgBouncer in transaction mode whose pool holds one server connection."""
    with django_through_pgbouncer(pool_size=1) as bouncer:
        yield bouncer


def _clients(tenant: Tenant, user: Any) -> tuple[APIClient, Client]:
    _, raw = api_key_create(actor="test", tenant=tenant, name="pool")
    api = APIClient(raise_request_exception=False)
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    web = Client(raise_request_exception=False)
    web.force_login(user)
    return api, web


def _requests(api: APIClient, web: Client, seen: list[tuple[str, Any]]) -> None:
    """One tenant's requests: reads, and failures inside a transaction and in a statement."""
    for n in range(ROUNDS):
        fail_in = "transaction" if n % 2 == 0 else "statement"
        seen.append(("api", api.get("/api/v1/pooler-probe")))
        seen.append(("api fails", api.post("/api/v1/pooler-probe/fail", {"in": fail_in})))
        seen.append(("web", web.get("/pooler-probe/web/")))
        seen.append(("web fails", web.get(f"/pooler-probe/web/fail/?in={fail_in}")))
        seen.append(("api list", api.get("/api/v1/schedules")))


def _interleaved(sessions: dict[str, tuple[APIClient, Client]]) -> dict[str, list[Any]]:
    """Each tenant's requests in a thread of its own (its own client connection), at once."""
    seen: dict[str, list[Any]] = {slug: [] for slug in sessions}
    failures: list[BaseException] = []

    def run(slug: str) -> None:
        try:
            _requests(*sessions[slug], seen[slug])
        except BaseException as exc:  # reported by the test below
            failures.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(slug,)) for slug in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures
    return seen


def _assert_only_own(seen: list[tuple[str, Any]], tenant: Tenant, rounds: int = ROUNDS) -> set[int]:
    """Every read saw exactly this tenant's rows; returns the server connections used."""
    own = {
        "role": "tick_web",
        "schedule_tenants": [str(tenant.id)],
        "schedules_sql": 1,
        "occurrences": 1,
        "tenants": [tenant.slug],
    }
    server_pids = set()
    kinds = [kind for kind, _ in seen]
    assert kinds.count("api") == kinds.count("web") == rounds
    for kind, response in seen:
        if kind in ("api", "web"):
            assert response.status_code == 200, (kind, response.content)
            body = response.json()
            assert {key: body[key] for key in own} == own, (kind, body)
            assert {key: body["again"][key] for key in own} == own, (kind, body)
            server_pids.add(body["server_pid"])
        elif kind == "api list":
            assert response.status_code == 200, (kind, response.content)
            assert [item["name"] for item in response.json()["results"]] == [f"{tenant.slug}'s"]
        else:
            assert response.status_code == 500, kind  # failed in the middle, rolled back
    return server_pids


def _owner_connection_is_clean() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_user = session_user, current_setting('tick.tenant_id', true)"
        )
        same_role, tenant = cursor.fetchone()
    assert same_role is True
    assert tenant in (None, "")


@pytest.mark.pooler
def test_two_tenants_share_one_pgbouncer_server_connection_without_a_leak(
    pool_of_one, tenant_a, tenant_b, alice, charlie
):
    sessions = {"alpha": _clients(tenant_a, alice), "bravo": _clients(tenant_b, charlie)}

    seen = _interleaved(sessions)

    pids_a = _assert_only_own(seen["alpha"], tenant_a)
    pids_b = _assert_only_own(seen["bravo"], tenant_b)
    assert len(pids_a | pids_b) == 1  # one server connection served both tenants
    _owner_connection_is_clean()


@pytest.fixture
def persistent(rows: None) -> Iterator[None]:
    """Django's persistent connections (CONN_MAX_AGE), directly to PostgreSQL."""
    saved = connection.settings_dict["CONN_MAX_AGE"]
    connections.close_all()
    connection.settings_dict["CONN_MAX_AGE"] = 600
    try:
        yield
    finally:
        connection.settings_dict["CONN_MAX_AGE"] = saved


def test_a_persistent_connection_carries_no_tenant_into_the_next_request(
    persistent, tenant_a, tenant_b, alice, charlie
):
    # One thread, one connection: the two tenants' requests (and their failures) take turns.
    a_clients, b_clients = _clients(tenant_a, alice), _clients(tenant_b, charlie)
    seen_a: list[tuple[str, Any]] = []
    seen_b: list[tuple[str, Any]] = []

    for _ in range(2):
        _requests(*a_clients, seen_a)
        _requests(*b_clients, seen_b)

    pids = _assert_only_own(seen_a, tenant_a, 2 * ROUNDS) | _assert_only_own(
        seen_b, tenant_b, 2 * ROUNDS
    )
    assert len(pids) == 1  # the same connection throughout
    _owner_connection_is_clean()
