"""The schedule table's indexes: each advance of next_run_at (a non-HOT update, next_run_at
being indexed) writes an entry into every one, so none may be redundant
(docs/decisions.md "Fewer schedule index writes")."""

from __future__ import annotations

import pytest
from django.db import connection

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
