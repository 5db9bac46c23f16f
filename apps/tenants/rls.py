"""Row-level security: PostgreSQL's second wall behind the application's tenant filters
(docs/decisions.md "Row-level security"; deployment in docs/operations.md).

Two halves:

* **Schema** (used by migrations): `WebRoleGrants` makes sure the web role exists and may use
  the tables; `EnableTenantRLS("table")` turns row-level security on for one tenant-owned
  table with the one isolation policy. A new tenant-owned table needs exactly one
  `EnableTenantRLS` line in its migration; a door that must find a row before it knows the
  tenant (by a secret's hash) adds `AllowLookupBy` and calls `lookup_present`.
* **Requests** (used by the web doors): the web process's requests run as the web role
  (`SET LOCAL ROLE`, a no-op when it already connects as that role) with the current tenant,
  user and staff flag in settings that the policies read. They are transaction-local: an
  execute wrapper starts every transaction of the request with them (`request_begin` installs
  it, `request_end` removes it), so no tenant outlives its transaction — on a persistent
  connection or behind a transaction-mode pooler (docs/decisions.md "Row-level security").

The engine (materializer, relay, worker, reaper, audit, commands) connects as the tables'
owner: row-level security is ENABLEd, not FORCEd, so the owner is exempt and its hot paths
carry no policy at all.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection, migrations
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps
from psycopg.pq import TransactionStatus

# The settings the policies read. Custom settings need a dotted name; unset they read
# as NULL (`current_setting(name, true)`), and '' (what `request_end` leaves) as no tenant.
TENANT_SETTING = "tick.tenant_id"
USER_SETTING = "tick.user_id"
STAFF_SETTING = "tick.staff"
API_KEY_HASH_SETTING = "tick.api_key_hash"
INVITATION_TOKEN_SETTING = "tick.invitation_token_hash"  # noqa: S105 - a setting name
# Settings a door may set before the tenant is known (`lookup_present`, `AllowLookupBy`);
# cleared at the start and end of every request. A new lookup adds its setting here.
LOOKUP_SETTINGS = (API_KEY_HASH_SETTING, INVITATION_TOKEN_SETTING)

POLICY = "tick_tenant_isolation"

# Wrapped in a scalar sub-select: PostgreSQL evaluates it once per statement (an InitPlan)
# instead of parsing the setting for every row, and can use it as an index condition.
CURRENT_TENANT_SQL = f"(SELECT NULLIF(current_setting('{TENANT_SETTING}', true), '')::uuid)"
CURRENT_USER_SQL = f"(SELECT NULLIF(current_setting('{USER_SETTING}', true), '')::integer)"
# Staff's view of every tenant is a *signed claim* in the staff setting, checked by a
# SECURITY DEFINER function against a key the web role cannot read: the web role can set
# `tick.staff` to anything, but only the web process (which holds SECRET_KEY) can make a
# claim the function accepts (docs/security.md "Staff access").
STAFF_FUNCTION = "tick_staff"
STAFF_KEY_TABLE = "tick_staff_key"
STAFF_SQL = f"(SELECT {STAFF_FUNCTION}())"
# How long a claim holds, from the start of the admin request that made it.
STAFF_CLAIM_TTL_S = 600


def setting_sql(setting: str) -> str:
    """A lookup setting's value in a policy: NULL (matches nothing) when unset or empty."""
    return f"(SELECT NULLIF(current_setting('{setting}', true), ''))"


API_KEY_HASH_SQL = setting_sql(API_KEY_HASH_SETTING)


def tenant_predicate(column: str) -> str:
    """Rows of the current tenant; every row on a staff request of the Django admin."""
    return f'("{column}" = {CURRENT_TENANT_SQL} OR {STAFF_SQL})'


# --------------------------------------------------------------------------------------------
# Schema (migrations)
# --------------------------------------------------------------------------------------------


def web_role() -> str:
    return str(settings.TICK_DB_WEB_ROLE)


class EnableTenantRLS(migrations.RunSQL):
    """Row-level security on one tenant-owned table: the web role may read and write only the
    rows whose `column` is the request's tenant (all rows on a staff admin request).

    Grants the web role DML on the table too (for tables created before `WebRoleGrants` set
    the default privileges). Idempotent: re-running replaces the policy.
    """

    def __init__(self, table: str, column: str = "tenant_id") -> None:
        self.table, self.column = table, column
        predicate = tenant_predicate(column)
        super().__init__(
            sql=[
                f'ALTER TABLE "{table}" ENABLE ROW LEVEL SECURITY',
                f'DROP POLICY IF EXISTS {POLICY} ON "{table}"',
                f'CREATE POLICY {POLICY} ON "{table}" USING {predicate} WITH CHECK {predicate}',
            ],
            reverse_sql=[
                f'DROP POLICY IF EXISTS {POLICY} ON "{table}"',
                f'ALTER TABLE "{table}" DISABLE ROW LEVEL SECURITY',
            ],
        )

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: Any,
        to_state: Any,
    ) -> None:
        # The policy calls the staff check: make sure it exists, whatever order the apps'
        # migrations run in (idempotent).
        _install_staff_check(from_state.apps, schema_editor)
        super().database_forwards(app_label, schema_editor, from_state, to_state)
        role = schema_editor.connection.ops.quote_name(web_role())
        schema_editor.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON "{self.table}" TO {role}')

    def describe(self) -> str:
        return f"Row-level security on {self.table} by {self.column}"


class AllowLookupBy(migrations.RunSQL):
    """Before the tenant is known, a door may read the rows of `table` whose `column` equals
    the value it put in `setting` (`lookup_present`) — e.g. the one API key whose hash the
    caller presented. SELECT only; `setting` must be listed in LOOKUP_SETTINGS. Choose a
    column only the holder of a secret can know (a hash of it), never an enumerable id."""

    def __init__(self, table: str, column: str, setting: str) -> None:
        name = f"tick_lookup_by_{column}"
        super().__init__(
            sql=[
                f'DROP POLICY IF EXISTS {name} ON "{table}"',
                f'CREATE POLICY {name} ON "{table}" FOR SELECT '
                f'USING ("{column}" = {setting_sql(setting)})',
            ],
            reverse_sql=[f'DROP POLICY IF EXISTS {name} ON "{table}"'],
        )


def _role_exists_sql(role: str) -> str:
    # A DO block: roles are cluster-wide and parallel test databases migrate at once, so a
    # concurrent CREATE ROLE that wins the race is not an error here.
    # The name passed tickweb/checks.py (tick.E020): a plain identifier, no quoting needed.
    return f"""
DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') THEN
    BEGIN
      CREATE ROLE {role} LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
    END;
  END IF;
END $$"""


def staff_key() -> bytes:
    """The key staff claims are signed with, derived from SECRET_KEY (so rotating SECRET_KEY
    and running `manage.py migrate`, which stores it, rotates it too)."""
    return hashlib.sha256(b"tick.staff-claim|" + settings.SECRET_KEY.encode()).digest()


def _staff_function_sql(role: str) -> list[str]:
    """The staff check the policies call, and the one-row table of its key, which only the
    owner reads: `tick.staff` must hold `<expires>.<tag>` where tag signs this connection's
    backend pid, the signed-in user and the expiry (`staff_claim`). The pid binds a claim to
    its connection: a claim read elsewhere (pg_stat_activity shows other sessions' queries to
    the same role) opens nothing on another connection."""
    return [
        f"CREATE TABLE IF NOT EXISTS {STAFF_KEY_TABLE} "
        "(id integer PRIMARY KEY CHECK (id = 1), key bytea NOT NULL)",
        # The default privileges give the web role every new table: not this one.
        f"REVOKE ALL ON {STAFF_KEY_TABLE} FROM PUBLIC, {role}",
        f"""
CREATE OR REPLACE FUNCTION {STAFF_FUNCTION}() RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  claim text := current_setting('{STAFF_SETTING}', true);
  member text := current_setting('{USER_SETTING}', true);
  secret bytea;
  expires bigint;
BEGIN
  IF claim IS NULL OR member IS NULL OR claim !~ '^[0-9]{{1,12}}[.][0-9a-f]{{64}}$'
     OR member !~ '^[0-9]{{1,19}}$' THEN
    RETURN false;
  END IF;
  expires := split_part(claim, '.', 1)::bigint;
  IF expires < extract(epoch FROM now()) THEN
    RETURN false;
  END IF;
  SELECT k.key INTO secret FROM public.{STAFF_KEY_TABLE} k WHERE k.id = 1;
  IF secret IS NULL THEN
    RETURN false;
  END IF;
  RETURN split_part(claim, '.', 2) = encode(sha256(secret || sha256(secret || convert_to(
    pg_backend_pid()::text || '|' || member || '|' || expires::text, 'UTF8'))), 'hex');
END
$fn$""",
        f"REVOKE ALL ON FUNCTION {STAFF_FUNCTION}() FROM PUBLIC",
        f"GRANT EXECUTE ON FUNCTION {STAFF_FUNCTION}() TO {role}",
    ]


def staff_claim_sign(*, pid: int, user_id: int, expires: int) -> str:
    """`<expires>.<tag>`: what `tick_staff()` accepts on backend `pid` for `user_id` until
    `expires` (Unix seconds). SHA-256(key || SHA-256(key || message)): the outer hash over a
    fixed-length inner one leaves no length extension."""
    key = staff_key()
    message = f"{pid}|{user_id}|{expires}".encode()
    tag = hashlib.sha256(key + hashlib.sha256(key + message).digest()).hexdigest()
    return f"{expires}.{tag}"


def staff_key_store(conn: BaseDatabaseWrapper) -> None:
    """Store the current staff key (`post_migrate`, as the tables' owner)."""
    with conn.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [STAFF_KEY_TABLE])
        row = cursor.fetchone()
        if row is None or row[0] is None:
            return  # before the migration that creates it
        cursor.execute(
            f"INSERT INTO {STAFF_KEY_TABLE} (id, key) VALUES (1, %s) "
            "ON CONFLICT (id) DO UPDATE SET key = EXCLUDED.key",
            [staff_key()],
        )


def staff_key_stored(sender: Any, using: str = "default", **kwargs: Any) -> None:
    """`post_migrate` receiver: `staff_key_store` on the migrated database."""
    from django.db import connections

    staff_key_store(connections[using])


def _install_staff_check(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    ops: Any = schema_editor.connection.ops
    for statement in _staff_function_sql(ops.quote_name(web_role())):
        schema_editor.execute(statement)


def _grants(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    ops: Any = schema_editor.connection.ops
    role = ops.quote_name(web_role())
    schema_editor.execute(_role_exists_sql(web_role()))
    # Before any policy: every tenant policy calls the staff check.
    _install_staff_check(apps, schema_editor)
    schema_editor.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
    schema_editor.execute(
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}"
    )
    schema_editor.execute(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {role}")
    # Tables (and sequences) this role creates later: other apps' migrations, partitions.
    schema_editor.execute(
        "ALTER DEFAULT PRIVILEGES IN SCHEMA public "
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {role}"
    )
    schema_editor.execute(
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO {role}"
    )


def _revoke(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    ops: Any = schema_editor.connection.ops
    role = ops.quote_name(web_role())
    schema_editor.execute(
        "ALTER DEFAULT PRIVILEGES IN SCHEMA public "
        f"REVOKE SELECT, INSERT, UPDATE, DELETE ON TABLES FROM {role}"
    )
    schema_editor.execute(
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE USAGE, SELECT ON SEQUENCES FROM {role}"
    )
    schema_editor.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}")
    schema_editor.execute(f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {role}")


def WebRoleGrants() -> migrations.RunPython:  # noqa: N802 - reads like the other operations
    """The web role exists (created if missing) and may use every table of the schema, now
    and later (default privileges of the migrating role)."""
    return migrations.RunPython(_grants, _revoke, elidable=False)


def _tenant_policies_signed(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    _install_staff_check(apps, schema_editor)
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT tablename FROM pg_policies WHERE schemaname = 'public' AND policyname = %s",
            [POLICY],
        )
        tables = sorted(row[0] for row in cursor.fetchall())
    for table in tables:
        predicate = tenant_predicate("id" if table == "tenants_tenant" else "tenant_id")
        schema_editor.execute(f'DROP POLICY {POLICY} ON "{table}"')
        schema_editor.execute(
            f'CREATE POLICY {POLICY} ON "{table}" USING {predicate} WITH CHECK {predicate}'
        )


def SignedStaffClaims() -> migrations.RunPython:  # noqa: N802 - reads like the other operations
    """Databases whose policies trusted a plain `tick.staff = 'on'`: the staff check
    installed and every tenant policy re-created to call it."""
    return migrations.RunPython(_tenant_policies_signed, migrations.RunPython.noop)


def partition_rls_sql(partition: str) -> str:
    """A partition read directly (not through its parent) obeys only its own row-level
    security, which PostgreSQL does not copy from the parent: enabled with no policy, it shows
    the web role nothing. Through the parent the parent's policy applies (docs/decisions.md)."""
    return f'ALTER TABLE "{partition}" ENABLE ROW LEVEL SECURITY'


def _existing_partitions_rls(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relispartition"
        )
        names = [row[0] for row in cursor.fetchall()]
    for name in names:
        schema_editor.execute(partition_rls_sql(name))


def PartitionsRLS() -> migrations.RunPython:  # noqa: N802 - reads like the other operations
    """Deny-all row-level security on every partition that exists already (`manage.py
    partitions` does the same for each one it creates)."""
    return migrations.RunPython(_existing_partitions_rls, migrations.RunPython.noop)


# --------------------------------------------------------------------------------------------
# Requests (the web process)
# --------------------------------------------------------------------------------------------

# Kept on the connection object (which outlives a reconnect) while a request runs under the
# web role: the doors below are no-ops outside a request (commands, the engine, tests calling
# services directly).
_SETTINGS = "tick_rls_settings"
# A staff request's claim expiry: the claim itself is signed anew for each transaction's
# backend (`_for_this_transaction`).
_STAFF_EXPIRES = "tick_rls_staff_expires"


def active(conn: BaseDatabaseWrapper | None = None) -> bool:
    return getattr(conn or connection, _SETTINGS, None) is not None


def _set_config_sql(values: dict[str, str]) -> tuple[str, list[str]]:
    # Transaction scope (is_local = true, as SET LOCAL): nothing outlives the transaction, so
    # a transaction-mode pooler may hand the server connection to anyone afterwards.
    select = ", ".join("set_config(%s, %s, true)" for _ in values)
    return f"SELECT {select}", [item for pair in values.items() for item in pair]


def _raw_cursor(conn: BaseDatabaseWrapper) -> psycopg.ClientCursor[Any]:
    # The driver's cursor, past Django's execute wrappers (ours among them); client-side
    # binding whatever the OPTIONS say, so one call may carry BEGIN and the settings.
    return psycopg.ClientCursor(conn.connection)


def _in_transaction(conn: BaseDatabaseWrapper) -> bool:
    raw = conn.connection
    return raw is not None and raw.info.transaction_status == TransactionStatus.INTRANS


def _for_this_transaction(
    conn: BaseDatabaseWrapper, cursor: Any, values: dict[str, str]
) -> dict[str, str]:
    """`values` with a staff claim signed for the backend that runs this transaction (asked in
    it: behind a transaction pooler each transaction may run on another backend)."""
    expires = getattr(conn, _STAFF_EXPIRES, None)
    state = getattr(conn, _SETTINGS, None) or {}
    if not values.get(STAFF_SETTING) or expires is None or not state.get(USER_SETTING):
        return values
    cursor.execute("SELECT pg_backend_pid()")
    row = cursor.fetchone()
    pid = int(row[0]) if row else 0
    claim = staff_claim_sign(pid=pid, user_id=int(state[USER_SETTING]), expires=expires)
    return {**values, STAFF_SETTING: claim}


def _apply_now(conn: BaseDatabaseWrapper, values: dict[str, str]) -> None:
    """Into the transaction that is open now (a change of tenant in mid-transaction, or a
    test's enclosing transaction); an idle connection gets them with its next statement."""
    if _in_transaction(conn):
        with conn.wrap_database_errors, _raw_cursor(conn) as cursor:
            sql, params = _set_config_sql(_for_this_transaction(conn, cursor, values))
            cursor.execute(sql, params)


def _with_settings(
    execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]
) -> Any:
    """Execute wrapper of a request's connection: every transaction the request runs starts
    with the request's settings. A statement in an open transaction runs as it is; the first
    statement of an `atomic` block is preceded by the settings (which begin the transaction);
    an autocommit statement is wrapped in BEGIN, the settings, COMMIT."""
    conn: BaseDatabaseWrapper = context["connection"]
    values = getattr(conn, _SETTINGS, None)
    raw = conn.connection
    if not values or raw is None or raw.info.transaction_status != TransactionStatus.IDLE:
        return execute(sql, params, many, context)
    autocommit = conn.get_autocommit()
    with conn.wrap_database_errors, _raw_cursor(conn) as cursor:
        begin = "BEGIN; " if autocommit else ""
        if begin and values.get(STAFF_SETTING):
            cursor.execute("BEGIN")  # the claim needs this transaction's backend first
            begin = ""
        settings_sql, settings_params = _set_config_sql(_for_this_transaction(conn, cursor, values))
        cursor.execute(begin + settings_sql, settings_params)
    if not autocommit:
        return execute(sql, params, many, context)
    try:
        result = execute(sql, params, many, context)
    except BaseException:
        if raw.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
            with conn.wrap_database_errors, _raw_cursor(conn) as cursor:
                cursor.execute("ROLLBACK")
        raise
    with conn.wrap_database_errors, _raw_cursor(conn) as cursor:
        cursor.execute("COMMIT")
    return result


def _set(values: dict[str, str]) -> None:
    current = getattr(connection, _SETTINGS, None)
    if current is not None:
        current.update(values)
    _apply_now(connection, values)


def request_begin(*, user_id: int | None) -> None:
    """Start of a web request: the web role, no tenant yet, who is signed in, no staff
    claim (`staff_enter` adds one on the Django admin, after the second factor)."""
    values = {
        "role": web_role(),
        TENANT_SETTING: "",
        **dict.fromkeys(LOOKUP_SETTINGS, ""),
        USER_SETTING: "" if user_id is None else str(user_id),
        STAFF_SETTING: "",
    }
    setattr(connection, _SETTINGS, dict(values))
    setattr(connection, _STAFF_EXPIRES, None)
    if _with_settings not in connection.execute_wrappers:
        connection.execute_wrappers.append(_with_settings)
    _apply_now(connection, values)


def staff_enter(user_id: int) -> None:
    """A staff request of the Django admin that passed the second factor: every tenant's
    rows show, through a claim signed for each transaction's backend and this user, valid
    for STAFF_CLAIM_TTL_S from now."""
    if active():
        setattr(connection, _STAFF_EXPIRES, int(time.time()) + STAFF_CLAIM_TTL_S)
        _set({USER_SETTING: str(user_id), STAFF_SETTING: "signed per transaction"})


def request_end() -> None:
    """End of a web request: back to the connection's own role, every setting cleared (in a
    transaction still open, e.g. a test's; elsewhere they ended with their transactions)."""
    if _with_settings in connection.execute_wrappers:
        connection.execute_wrappers.remove(_with_settings)
    if not active():
        return
    setattr(connection, _SETTINGS, None)
    setattr(connection, _STAFF_EXPIRES, None)
    _apply_now(
        connection,
        {
            "role": "none",
            TENANT_SETTING: "",
            **dict.fromkeys(LOOKUP_SETTINGS, ""),
            USER_SETTING: "",
            STAFF_SETTING: "",
        },
    )


def user_enter(user_id: int) -> None:
    """The request acts for this user although no session says so yet (a password-reset link
    Django has just verified): their memberships show, as for a signed-in user."""
    if active():
        _set({USER_SETTING: str(user_id)})


def tenant_enter(tenant_id: uuid.UUID) -> None:
    """The request's tenant is known (API key or the web user's membership): its rows show."""
    if active():
        _set({TENANT_SETTING: str(tenant_id)})


def lookup_present(setting: str, value: str) -> None:
    """Before the tenant is known: the rows an `AllowLookupBy` policy ties to `setting` and
    `value` become readable (e.g. the one API key with this hash), nothing else."""
    if setting not in LOOKUP_SETTINGS:
        raise ValueError(f"{setting} is no lookup setting (LOOKUP_SETTINGS)")
    if active():
        _set({setting: value})
