# Row-level security, the second wall behind the tenant filters (docs/decisions.md
# "Row-level security"). Policies of the tenants app; see apps/tenants/rls.py.
from django.db import migrations

from apps.tenants.rls import (
    API_KEY_HASH_SETTING,
    API_KEY_HASH_SQL,
    CURRENT_USER_SQL,
    INVITATION_TOKEN_SETTING,
    AllowLookupBy,
    EnableTenantRLS,
    WebRoleGrants,
    setting_sql,
)

# Lookups made before the request's tenant is known, each as narrow as the door needs:
# - API-key authentication reads the one key whose hash the caller presented, and its
#   tenant;
# - a signed-in user reads their own memberships (the tenant picker, `tenant_page`),
# - and the tenants those memberships name;
# - an invitation link reads its one invitation (by the token's hash) and that tenant.
LOOKUP_POLICIES = [
    (
        "CREATE POLICY tick_tenant_of_invitation ON tenants_tenant FOR SELECT "
        "USING (id IN (SELECT i.tenant_id FROM tenants_invitation i "
        f"WHERE i.token_hash = {setting_sql(INVITATION_TOKEN_SETTING)}))",
        "DROP POLICY IF EXISTS tick_tenant_of_invitation ON tenants_tenant",
    ),
    (
        "CREATE POLICY tick_tenant_of_api_key ON tenants_tenant FOR SELECT "
        "USING (id IN (SELECT k.tenant_id FROM tenants_apikey k "
        f"WHERE k.key_hash = {API_KEY_HASH_SQL}))",
        "DROP POLICY IF EXISTS tick_tenant_of_api_key ON tenants_tenant",
    ),
    (
        "CREATE POLICY tick_membership_of_user ON tenants_membership FOR SELECT "
        f"USING (user_id = {CURRENT_USER_SQL})",
        "DROP POLICY IF EXISTS tick_membership_of_user ON tenants_membership",
    ),
    (
        "CREATE POLICY tick_tenant_of_user ON tenants_tenant FOR SELECT "
        "USING (id IN (SELECT m.tenant_id FROM tenants_membership m "
        f"WHERE m.user_id = {CURRENT_USER_SQL}))",
        "DROP POLICY IF EXISTS tick_tenant_of_user ON tenants_tenant",
    ),
]


class Migration(migrations.Migration):
    dependencies = [("tenants", "0008_members")]

    operations: list[migrations.operations.base.Operation] = [
        WebRoleGrants(),
        EnableTenantRLS("tenants_tenant", column="id"),
        EnableTenantRLS("tenants_membership"),
        EnableTenantRLS("tenants_apikey"),
        EnableTenantRLS("tenants_idempotencykey"),
        EnableTenantRLS("tenants_tenantevent"),
        EnableTenantRLS("tenants_signingsecret"),
        EnableTenantRLS("tenants_invitation"),
        AllowLookupBy("tenants_apikey", "key_hash", API_KEY_HASH_SETTING),
        AllowLookupBy("tenants_invitation", "token_hash", INVITATION_TOKEN_SETTING),
        *(migrations.RunSQL(sql, reverse) for sql, reverse in LOOKUP_POLICIES),
    ]
