"""Row-level security, the second wall (apps/tenants/rls.py): queries with no tenant filter
inside a web request see only the request's tenant; the engine (the tables' owner, as the
test connection is) sees everything; writes cannot reach or create another tenant's rows.

The probe views (rls_probe.py) query without any filter, as a forgotten filter would; every
other API and web test of the suite runs under the same restricted role as well."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from apps.occurrences.models import Occurrence
from apps.occurrences.pipeline.partitions import PARTITIONED_TABLES, partitions_ensure
from apps.occurrences.tests.support.rows import occurrence, schedule
from apps.schedules.models import Schedule
from apps.tenants import rls
from apps.tenants.models import TenantEvent
from apps.tenants.rls import POLICY
from apps.tenants.services import api_key_create

pytestmark = [pytest.mark.django_db, pytest.mark.urls("apps.tenants.tests.rls_probe")]


def _scalar(sql, params=None):
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchone()[0]


@pytest.fixture
def rows(tenant_a, tenant_b):
    """One schedule and one occurrence (in today's partition) per tenant; a key of B."""
    when = timezone.now().replace(second=0, microsecond=0)  # today's partition
    a, b = schedule(tenant_a, name="alpha's"), schedule(tenant_b, name="bravo's")
    occurrence(a, when)
    occurrence(b, when)
    api_key_create(actor="test", tenant=tenant_b, name="other")
    return a, b


def test_api_request_sees_only_its_tenant_through_unfiltered_queries(api_a, rows, tenant_a):
    body = api_a.get("/api/v1/rls-probe").json()

    assert body == {
        "role": "tick_web",
        "schedule_tenants": [str(tenant_a.id)],
        "schedules_sql": 1,
        "occurrences": 1,
        "partition": 0,  # a partition read directly shows nothing (its own deny-all RLS)
        "tenants": ["alpha"],
        "api_keys": 1,  # the caller's key; bravo's two keys stay hidden
    }
    # The engine side (the tables' owner, as this connection is outside a request) sees all.
    assert Schedule.objects.count() == 2
    assert Occurrence.objects.count() == 2
    assert _scalar("SELECT count(*) FROM schedules_schedule") == 2


def test_web_page_sees_only_the_users_tenant(client, alice, charlie, rows, tenant_b):
    client.force_login(charlie)

    body = client.get("/rls-probe/web/").json()

    assert body["schedule_tenants"] == [str(tenant_b.id)]
    assert (body["schedules_sql"], body["occurrences"], body["tenants"]) == (1, 1, ["bravo"])
    assert body["api_keys"] == 1  # bravo's own key; alpha's stays hidden


def test_api_request_cannot_write_another_tenants_rows(api_a, rows, tenant_a, tenant_b):
    _, theirs = rows

    body = api_a.post(
        "/api/v1/rls-probe",
        {"schedule_id": str(theirs.id), "tenant_id": str(tenant_b.id)},
        format="json",
    ).json()

    assert body["updated"] == 0
    assert body["inserted"].startswith("refused: new row violates row-level security policy")
    assert body["moved"].startswith("refused: new row violates row-level security policy")
    theirs.refresh_from_db()
    assert theirs.name == "bravo's"
    assert theirs.tenant_id == tenant_b.id
    assert not TenantEvent.objects.filter(actor="probe").exists()


def test_the_same_writes_on_its_own_rows_go_through(api_a, rows, tenant_a):
    mine, _ = rows

    body = api_a.post(
        "/api/v1/rls-probe",
        {"schedule_id": str(mine.id), "tenant_id": str(tenant_a.id)},
        format="json",
    ).json()

    assert (body["updated"], body["inserted"], body["moved"]) == (1, "written", 0)
    mine.refresh_from_db()
    assert mine.name == "hijacked"
    assert TenantEvent.objects.filter(actor="probe", tenant=tenant_a).count() == 1


def test_a_request_with_no_tenant_sees_no_tenant_rows(client, rows):
    body = client.get("/rls-probe/plain/").json()

    assert body["role"] == "tick_web"
    assert (body["schedules_sql"], body["occurrences"], body["api_keys"]) == (0, 0, 0)
    assert body["tenants"] == []


def test_a_user_outside_a_tenant_page_sees_only_their_tenants_names(client, alice, rows):
    client.force_login(alice)

    body = client.get("/rls-probe/plain/").json()

    assert body["tenants"] == ["alpha"]  # the tenant picker's lookup, nothing more
    assert (body["schedules_sql"], body["occurrences"], body["api_keys"]) == (0, 0, 0)


def test_staff_see_every_tenant_in_the_admin_only(client, rows, django_user_model):
    staff = django_user_model.objects.create_user("sam", password="pw-sam-123", is_staff=True)
    client.force_login(staff)

    in_admin = client.get("/admin/rls-probe/").json()
    elsewhere = client.get("/rls-probe/plain/").json()

    assert (in_admin["schedules_sql"], in_admin["occurrences"]) == (2, 2)
    assert in_admin["tenants"] == ["alpha", "bravo"]
    assert (elsewhere["schedules_sql"], elsewhere["tenants"]) == (0, [])


def test_a_non_staff_user_gets_nothing_from_an_admin_path(client, alice, rows):
    client.force_login(alice)

    body = client.get("/admin/rls-probe/").json()

    assert body["schedules_sql"] == 0


def test_the_admin_lists_every_tenants_schedules(admin_client, rows):
    page = admin_client.get("/admin/schedules/schedule/").content.decode()

    assert "alpha&#x27;s" in page
    assert "bravo&#x27;s" in page


def test_the_connection_leaves_a_request_as_it_entered(api_a, rows):
    api_a.get("/api/v1/rls-probe")

    assert _scalar("SELECT current_user = session_user") is True
    assert _scalar("SELECT current_setting('tick.tenant_id', true)") == ""
    assert _scalar("SELECT current_setting('tick.api_key_hash', true)") == ""
    assert _scalar("SELECT current_setting('tick.staff', true)") == ""


@pytest.mark.django_db(transaction=True)
def test_the_wall_holds_outside_a_test_transaction_too(api_a, api_b, rows, tenant_b):
    body = api_b.get("/api/v1/rls-probe").json()
    again = api_a.get("/api/v1/rls-probe").json()

    assert body["schedule_tenants"] == [str(tenant_b.id)]
    assert again["tenants"] == ["alpha"]
    assert _scalar("SELECT current_user = session_user") is True


@pytest.mark.django_db(transaction=True)
def test_a_connection_reopened_mid_request_keeps_the_wall(client, alice, rows, tenant_a):
    client.force_login(alice)

    body = client.get("/rls-probe/reconnect/").json()

    assert body["role"] == "tick_web"
    assert body["schedule_tenants"] == [str(tenant_a.id)]
    assert _scalar("SELECT current_user = session_user") is True


def test_every_tenant_owned_table_has_the_policy():
    """A new table with a tenant_id column needs `EnableTenantRLS("table")` in its
    migration; this lists the ones that lack it."""
    uncovered = _scalar(
        """
        SELECT coalesce(array_agg(c.relname ORDER BY c.relname), '{}')
        FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'public'
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'tenant_id'
        WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
          AND NOT (c.relrowsecurity AND EXISTS (
            SELECT FROM pg_policy p WHERE p.polrelid = c.oid AND p.polname = %s))
        """,
        [POLICY],
    )

    assert uncovered == []


def test_partitions_made_at_run_time_hide_their_rows_from_the_web_role():
    day = timezone.now().date() + timedelta(days=40)

    created = partitions_ensure([day])

    assert len(created) == len(PARTITIONED_TABLES)
    for name in created:
        assert _scalar("SELECT relrowsecurity FROM pg_class WHERE relname = %s", [name])
        assert _scalar("SELECT count(*) FROM pg_policy WHERE polrelid = %s::regclass", [name]) == 0


def test_the_web_role_is_restricted_and_owns_nothing():
    attrs = _scalar(
        "SELECT row(rolsuper, rolbypassrls)::text FROM pg_roles WHERE rolname = 'tick_web'"
    )
    owned = _scalar(
        "SELECT count(*) FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner "
        "WHERE r.rolname = 'tick_web'"
    )

    assert attrs == "(f,f)"
    assert owned == 0


def test_a_lookup_needs_a_declared_setting():
    with pytest.raises(ValueError, match="no lookup setting"):
        rls.lookup_present("tick.anything", "x")
