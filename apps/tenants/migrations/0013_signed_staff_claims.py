# Staff access the web role cannot declare, and the tables that name a user, not a tenant
# (docs/security.md "Staff access"). See apps/tenants/rls.py.
from django.db import migrations

from apps.tenants.rls import (
    CURRENT_TENANT_SQL,
    CURRENT_USER_SQL,
    STAFF_SQL,
    SignedStaffClaims,
)

_OWN_ROWS = f"(user_id = {CURRENT_USER_SQL} OR {STAFF_SQL})"
_KEYS_OF_TENANT = (
    "(api_key_id IN (SELECT k.id FROM tenants_apikey k "
    f"WHERE k.tenant_id = {CURRENT_TENANT_SQL}) OR {STAFF_SQL})"
)


def _policy(table: str, predicate: str) -> migrations.RunSQL:
    return migrations.RunSQL(
        sql=[
            f'ALTER TABLE "{table}" ENABLE ROW LEVEL SECURITY',
            f'DROP POLICY IF EXISTS tick_own_rows ON "{table}"',
            f'CREATE POLICY tick_own_rows ON "{table}" USING {predicate} WITH CHECK {predicate}',
        ],
        reverse_sql=[
            f'DROP POLICY IF EXISTS tick_own_rows ON "{table}"',
            f'ALTER TABLE "{table}" DISABLE ROW LEVEL SECURITY',
        ],
    )


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0012_api_key_created_by"),
        ("schedules", "0005_rls"),
        ("occurrences", "0015_relay_staging"),
        ("otp_totp", "0003_add_timestamps"),
    ]

    operations: list[migrations.operations.base.Operation] = [
        SignedStaffClaims(),
        # A signed-in user's own sessions (the account page), their own TOTP devices (the
        # admin's second factor), the current tenant's keys' rate windows.
        _policy("tenants_usersession", _OWN_ROWS),
        _policy("otp_totp_totpdevice", _OWN_ROWS),
        _policy("tenants_apikeyratewindow", _KEYS_OF_TENANT),
    ]
