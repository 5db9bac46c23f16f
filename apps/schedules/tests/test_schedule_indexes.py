"""The schedule table's indexes: each advance of next_run_at (a non-HOT update, next_run_at
being indexed) writes an entry into every one, so none may be redundant
(docs/decisions.md "Fewer schedule index writes")."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.db.models import QuerySet

from apps.schedules.models import Schedule
from apps.schedules.selectors import schedules_filtered
from apps.schedules.tests.factories import make_schedule
from apps.tenants.services import tenant_create

pytestmark = pytest.mark.django_db


def _index_columns() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT i.relname, pg_get_indexdef(x.indexrelid)
              FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
             WHERE x.indrelid = 'schedules_schedule'::regclass
            """
        )
        return dict(cursor.fetchall())


def test_no_index_is_a_prefix_of_another_on_tenant():
    definitions = _index_columns()
    tenant_only = [name for name, sql in definitions.items() if sql.endswith("(tenant_id)")]
    assert tenant_only == []
    # The tenant's lookups (listings, the PROTECT check of a tenant delete, row-level
    # security) are served by the composite indexes that lead with it.
    assert sum("btree (tenant_id," in sql for sql in definitions.values()) >= 3


def _plan(queryset: QuerySet[Schedule]) -> str:
    """The plan with table scans priced out (a test table is tiny)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        return queryset.explain()


def test_label_filter_uses_the_partial_labels_index():
    # given: schedules with and without labels
    tenant = tenant_create(slug="labels-index")
    make_schedule(tenant, labels={"team": "a"})
    make_schedule(tenant)
    # when
    queryset = schedules_filtered(tenant=tenant, label=[("team", "a")])
    # then: the filter states the partial index's predicate, which the planner needs to use
    # the index at all (only labelled schedules have an entry)
    assert "WHERE (NOT (labels = '{}'::jsonb))" in _index_columns()["schedule_labels_idx"]
    assert 'NOT ("schedules_schedule"."labels" = Jsonb({}))' in str(queryset.query)
    by_labels = Schedule.objects.filter(labels__contains={"team": "a"})
    assert "schedule_labels_idx" in _plan(by_labels.exclude(labels={}))
    assert "schedule_labels_idx" not in _plan(by_labels)
    assert [s.labels for s in queryset] == [{"team": "a"}]


def test_schedule_pages_keep_room_for_an_advanced_row():
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE oid = 'schedules_schedule'::regclass")
        row = cursor.fetchone()
    assert row is not None and row[0] == ["fillfactor=80"]
