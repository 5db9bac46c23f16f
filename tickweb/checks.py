"""System checks (`manage.py check`) for setting values the code relies on without checking.

Each refusal names the setting, what breaks, and the fix. Registered by
`tickweb.apps.TickwebConfig`, so every management command (and every process start through
`manage.py`) refuses a configuration that would misbehave quietly at run time.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from cryptography.fernet import Fernet
from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.core.checks import CheckMessage
from django.db import connections

from apps.occurrences.execution.demo_handlers import DEMO_HANDLERS

METRICS_TOKEN_MIN_LENGTH = 32

# Counts and batch sizes: zero or less stalls a loop or breaks its slicing (a zero envelope
# size cannot chunk a burst; a zero fire cap leaves a schedule with no next instant).
AT_LEAST_ONE = (
    "TICK_SHARDS",
    "TICK_TENANT_PARTITIONS",
    "TICK_MATERIALIZE_BATCH",
    "TICK_MAX_FIRES_PER_PASS",
    "TICK_RELAY_BATCH",
    "TICK_RELAY_ENVELOPE_MAX",
    "TICK_MAX_ATTEMPTS",
    "TICK_RETENTION_DAYS",
    # Zero would lock every username before its first password is checked.
    "TICK_LOGIN_FAILURE_LIMIT",
    "TICK_BACKFILL_MAX_INSTANTS",
    "TICK_INVITATION_TTL_DAYS",
    "TICK_ALERT_MAX_ATTEMPTS",
    "TICK_ALERT_DIGEST_LIST_MAX",
    # Zero would never send an alert again.
    "TICK_ALERT_TENANT_SENDS",
    # Zero would refuse every invitation, test alert and channel confirmation.
    "TICK_INVITATION_MAILS_PER_HOUR",
    "TICK_ALERT_TESTS_PER_HOUR",
    "TICK_ALERT_CONFIRMATIONS_PER_HOUR",
)
# Durations: zero or less expires every lease at once, spins a heartbeat or re-check loop,
# republishes every ENQUEUED occurrence at once, or is refused by the HTTP client.
POSITIVE = (
    "TICK_LEASE_TTL_S",
    "TICK_PLANNING_WINDOW_S",
    "TICK_ATTEMPT_LEASE_S",
    "TICK_RETRY_BASE_S",
    "TICK_RETRY_CAP_S",
    "TICK_RETRY_DEADLINE_S",
    "TICK_REDELIVER_AFTER_S",
    "TICK_REDELIVER_DEEP_EVERY_S",
    "TICK_OVERLAP_RECHECK_S",
    "TICK_OVERLAP_LOOKBACK_S",
    "TICK_WORKER_OUTAGE_RETRY_S",
    "TICK_WORKER_CONN_MAX_AGE",
    "TICK_COMPLETION_GROUP_MAX",
    "TICK_WORKER_PRESENCE_INTERVAL_S",
    "TICK_WORKER_PRESENCE_TTL_S",
    "TICK_DEFERRAL_ALERT_S",
    "TICK_WEBHOOK_CONNECT_TIMEOUT_S",
    "TICK_WEBHOOK_READ_TIMEOUT_S",
    "TICK_EGRESS_DEADLINE_S",
    "TICK_AUDIT_ENQUEUED_BOUND_S",
    "TICK_AUDIT_SCHEDULED_BOUND_S",
    "TICK_AUDIT_RUNNING_BOUND_S",
    "TICK_AUDIT_MATERIALIZE_LAG_S",
    # Zero or less: no failure would ever count, so logins would never be throttled.
    "TICK_LOGIN_COOLOFF_S",
    "TICK_ALERT_LAG_EVERY_S",
    "EMAIL_TIMEOUT",
)
# May be zero (no look-ahead, no planning span, no delay, no grace before a handler's hard
# stop, no MISSED rows, no partitions ahead), never negative.
NOT_NEGATIVE = (
    "TICK_RELAY_LOOKAHEAD_MS",
    "TICK_PLANNING_SPAN_S",
    "TICK_QUOTA_DELAY_S",
    "TICK_HANDLER_TIMEOUT_GRACE_S",
    "TICK_WORKER_SLOTS",
    "TICK_MISSED_RECORD_LIMIT",
    "TICK_PARTITION_DAYS_AHEAD",
    "TICK_METRICS_TOP_TENANTS",
    "TICK_SIGNING_ROTATION_OVERLAP_S",
    "TICK_SESSION_SEEN_RESOLUTION_S",
    "TICK_ALERT_COALESCE_S",
    "TICK_ALERT_CHANNEL_INTERVAL_S",
)

Apps = Sequence[AppConfig] | None


@dataclass(frozen=True)
class Rule:
    """A relation the code relies on between settings: `holds` reads them (the Django
    settings, or the values given to `broken`); otherwise the check reports `message`, in
    which `{s.NAME}` is the setting's value, with `hint`."""

    id: str
    holds: Callable[[Any], bool]
    message: str
    hint: str
    level: Callable[..., CheckMessage] = checks.Error


def broken(rules: Sequence[Rule], values: Any = settings) -> list[CheckMessage]:
    """A message for each rule that `values` (by default the Django settings) break, in the
    rules' order."""
    return [
        rule.level(rule.message.format(s=values), hint=rule.hint, id=rule.id)
        for rule in rules
        if not rule.holds(values)
    ]


# Stored instants, partition days and retry budgets are all UTC.
UTC_RULES = (
    Rule(
        "tick.E001",
        lambda s: s.TIME_ZONE == "UTC",
        "TIME_ZONE is {s.TIME_ZONE!r}; Tick runs in UTC.",
        'Set TIME_ZONE = "UTC"; schedules carry their own time zone.',
    ),
    Rule(
        "tick.E002",
        lambda s: s.USE_TZ,
        "USE_TZ is off; Tick compares and stores aware datetimes only.",
        "Set USE_TZ = True.",
    ),
)

PIPELINE_WINDOW_RULES = (
    Rule(
        "tick.E006",
        lambda s: s.TICK_PLANNING_WINDOW_S * 1000 > s.TICK_RELAY_LOOKAHEAD_MS,
        "TICK_PLANNING_WINDOW_S ({s.TICK_PLANNING_WINDOW_S} s) is not greater than "
        "TICK_RELAY_LOOKAHEAD_MS ({s.TICK_RELAY_LOOKAHEAD_MS} ms): the relay would look further "
        "ahead than the materializer has written, so bursts are not read before their instant.",
        "Raise TICK_PLANNING_WINDOW_S or lower TICK_RELAY_LOOKAHEAD_MS.",
    ),
    Rule(
        "tick.E007",
        lambda s: s.TICK_PLANNING_WINDOW_S > s.TICK_LEASE_TTL_S,
        "TICK_PLANNING_WINDOW_S ({s.TICK_PLANNING_WINDOW_S} s) is not greater than "
        "TICK_LEASE_TTL_S ({s.TICK_LEASE_TTL_S} s): occurrences due while a dead "
        "materializer's shard leases expire would be written late.",
        "Keep the planning window well above the shard lease TTL.",
    ),
    Rule(
        "tick.E008",
        lambda s: s.TICK_RETENTION_DAYS * 86_400 >= s.TICK_RETRY_DEADLINE_S,
        "TICK_RETENTION_DAYS ({s.TICK_RETENTION_DAYS}) is shorter than TICK_RETRY_DEADLINE_S "
        "({s.TICK_RETRY_DEADLINE_S} s): partitions would be dropped while their occurrences "
        "can still be retried.",
        "Raise TICK_RETENTION_DAYS or lower TICK_RETRY_DEADLINE_S.",
    ),
)

# The relay renews its shard leases between steps, and one step may wait for its instant up
# to the look-ahead: a shorter lease expires mid-step, another relay takes the shards, and
# their rows are published twice (same ids: duplicates, never losses).
LEASE_TTL_RULES = (
    Rule(
        "tick.W003",
        lambda s: s.TICK_LEASE_TTL_S * 1000 > s.TICK_RELAY_LOOKAHEAD_MS + 1000,
        "TICK_LEASE_TTL_S ({s.TICK_LEASE_TTL_S} s) is not above TICK_RELAY_LOOKAHEAD_MS "
        "({s.TICK_RELAY_LOOKAHEAD_MS} ms) + 1 s: a relay step waiting for its instant "
        "outlives its shard leases, and another relay publishes the same rows again.",
        "Keep the lease TTL well above the look-ahead (defaults: 15 s and 5 s).",
        checks.Warning,
    ),
)

# The tenant share of worker slots and the worker presence it is counted over.
FAIR_SHARE_RULES = (
    Rule(
        "tick.E011",
        lambda s: 0 < s.TICK_TENANT_SLOT_SHARE <= 1,
        "TICK_TENANT_SLOT_SHARE is {s.TICK_TENANT_SLOT_SHARE}; it must be greater than 0 and "
        "at most 1 (a fraction of the live worker slots one tenant may hold).",
        "Set TICK_TENANT_SLOT_SHARE to e.g. 0.5; 1 lets one tenant take every slot.",
    ),
    Rule(
        "tick.E017",
        lambda s: 0 <= s.TICK_STRICT_RESERVED_SHARE < 1,
        "TICK_STRICT_RESERVED_SHARE is {s.TICK_STRICT_RESERVED_SHARE}; it must be at least 0 "
        "and below 1 (a fraction of the live worker slots kept from recovery work).",
        "Set TICK_STRICT_RESERVED_SHARE to e.g. 0.5; 0 reserves nothing.",
    ),
    Rule(
        "tick.E012",
        lambda s: s.TICK_WORKER_PRESENCE_INTERVAL_S < s.TICK_WORKER_PRESENCE_TTL_S,
        "TICK_WORKER_PRESENCE_INTERVAL_S ({s.TICK_WORKER_PRESENCE_INTERVAL_S} s) is not below "
        "TICK_WORKER_PRESENCE_TTL_S ({s.TICK_WORKER_PRESENCE_TTL_S} s): live workers would "
        "drop out of the capacity between their beats, and tenants' shares would shrink or "
        "vanish.",
        "Keep the TTL at two or three beat intervals or more.",
    ),
)

# The reconcile audit's ENQUEUED bound counts a retry's backoff (docs/decisions.md).
AUDIT_BOUND_RULES = (
    Rule(
        "tick.W001",
        lambda s: s.TICK_AUDIT_ENQUEUED_BOUND_S > s.TICK_RETRY_CAP_S,
        "TICK_AUDIT_ENQUEUED_BOUND_S ({s.TICK_AUDIT_ENQUEUED_BOUND_S} s) is not greater than "
        "TICK_RETRY_CAP_S ({s.TICK_RETRY_CAP_S} s): `reconcile` would report retries still "
        "waiting out their backoff as stuck.",
        "Raise TICK_AUDIT_ENQUEUED_BOUND_S above the retry cap plus a queue wait.",
        checks.Warning,
    ),
)


def rules_check(
    rules: Sequence[Rule], *tags: str, deploy: bool = False
) -> Callable[..., list[CheckMessage]]:
    """A registered system check (with `tags`; `deploy`: only under `check --deploy`) that
    reports the broken ones of `rules`."""

    def check(app_configs: Apps = None, **kwargs: Any) -> list[CheckMessage]:
        return broken(rules)

    return checks.register(*tags, deploy=deploy)(check)


check_utc = rules_check(UTC_RULES)


# (settings, what each value must be, test, id)
RANGE_RULES: tuple[tuple[tuple[str, ...], str, Callable[[float], bool], str], ...] = (
    (AT_LEAST_ONE, "at least 1", lambda value: value >= 1, "tick.E003"),
    (POSITIVE, "greater than 0", lambda value: value > 0, "tick.E004"),
    (NOT_NEGATIVE, "0 or more", lambda value: value >= 0, "tick.E005"),
)


@checks.register()
def check_value_ranges(app_configs: Apps = None, **kwargs: Any) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for names, requirement, holds, error_id in RANGE_RULES:
        for name in names:
            value = getattr(settings, name)
            if not holds(value):
                errors.append(
                    checks.Error(
                        f"{name} is {value}; it must be {requirement}.",
                        hint=f"Set the {name} environment variable ({requirement}).",
                        id=error_id,
                    )
                )
    return errors


check_pipeline_windows = rules_check(PIPELINE_WINDOW_RULES)
check_lease_ttl = rules_check(LEASE_TTL_RULES)
check_fair_share = rules_check(FAIR_SHARE_RULES)
check_audit_bounds = rules_check(AUDIT_BOUND_RULES)


@checks.register()
def check_extra_handlers(app_configs: Apps = None, **kwargs: Any) -> list[CheckMessage]:
    """TICK_EXTRA_HANDLERS may name demo handlers only."""
    unknown = [name for name in settings.TICK_EXTRA_HANDLERS if name not in DEMO_HANDLERS]
    if not unknown:
        return []
    return [
        checks.Error(
            f"TICK_EXTRA_HANDLERS names {', '.join(map(repr, unknown))}, which is no demo "
            "handler: it would not be offered, and schedules naming it would be refused.",
            hint=f"Name only demo handlers ({', '.join(sorted(DEMO_HANDLERS))}), or none.",
            id="tick.E009",
        )
    ]


# Only under `check --deploy` (the production checklist): the test runner forces DEBUG off, so
# DEBUG cannot tell a debug run from production here.
@checks.register(checks.Tags.security, deploy=True)
def check_demo_handlers_off(app_configs: Apps = None, **kwargs: Any) -> list[CheckMessage]:
    """A production deployment offers no demo handler."""
    enabled = [name for name in settings.TICK_EXTRA_HANDLERS if name in DEMO_HANDLERS]
    if not enabled:
        return []
    return [
        checks.Warning(
            f"TICK_EXTRA_HANDLERS offers {', '.join(map(repr, enabled))}: any tenant can make a "
            "worker slot sleep or fail through its payload.",
            hint="Leave TICK_EXTRA_HANDLERS unset (empty) in production; demo handlers are "
            "for `make run` and tests.",
            id="tick.W002",
        )
    ]


@checks.register()
def check_metrics_access(app_configs: Apps = None, **kwargs: Any) -> list[CheckMessage]:
    """TICK_METRICS_ALLOWED_NETWORKS are CIDRs; a TICK_METRICS_TOKEN is long enough."""
    errors: list[CheckMessage] = []
    for cidr in settings.TICK_METRICS_ALLOWED_NETWORKS:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            errors.append(
                checks.Error(
                    f"TICK_METRICS_ALLOWED_NETWORKS has {cidr!r}, which is no network: /metrics "
                    "would fail for every request.",
                    hint="Use CIDRs such as 127.0.0.0/8,10.0.0.0/8 (comma-separated), or leave "
                    "it unset for loopback only.",
                    id="tick.E020",
                )
            )
    token = settings.TICK_METRICS_TOKEN
    if token and len(token) < METRICS_TOKEN_MIN_LENGTH:
        errors.append(
            checks.Warning(
                f"TICK_METRICS_TOKEN has {len(token)} characters: short enough to guess.",
                hint=f"Use at least {METRICS_TOKEN_MIN_LENGTH} random characters, e.g. "
                "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`.",
                id="tick.W020",
            )
        )
    return errors


@checks.register()
def check_signing_keys(app_configs: Apps = None, **kwargs: Any) -> list[CheckMessage]:
    """Each TICK_SIGNING_KEYS entry must be a Fernet key, or no webhook secret can be stored
    or read (apps/tenants/signing.py)."""
    errors: list[CheckMessage] = []
    for index, key in enumerate(settings.TICK_SIGNING_KEYS):
        try:
            Fernet(key.encode())
        except ValueError:
            errors.append(
                checks.Error(
                    f"TICK_SIGNING_KEYS entry {index + 1} is not a Fernet key (32 url-safe "
                    "base64-encoded bytes): webhook signing secrets could not be encrypted or "
                    "decrypted.",
                    hint="Generate one with `python -c 'from cryptography.fernet import "
                    "Fernet; print(Fernet.generate_key().decode())'` (docs/webhooks.md).",
                    id="tick.E060",
                )
            )
    return errors


# A PostgreSQL role name as the migrations and `SET ROLE` use it: unquoted-identifier rules,
# so it needs no quoting anywhere it is written (docs/operations.md).
ROLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

check_web_role = rules_check(
    (
        Rule(
            "tick.E021",
            lambda s: (
                bool(ROLE_NAME.match(s.TICK_DB_WEB_ROLE))
                and not s.TICK_DB_WEB_ROLE.startswith("pg_")
            ),
            "TICK_DB_WEB_ROLE is {s.TICK_DB_WEB_ROLE!r}, which is no plain PostgreSQL role "
            "name: web requests could not switch to it, so every page and API call would fail.",
            "Use lower-case letters, digits and underscores (not starting with a digit or pg_), "
            "at most 63 characters; the default is tick_web.",
        ),
    )
)

# Only under `check --deploy` (the production checklist), like tick.W002.
# A production admin asks staff for a TOTP code (docs/operations.md "Admin two-factor").
check_admin_two_factor = rules_check(
    (
        Rule(
            "tick.W004",
            lambda s: s.TICK_ADMIN_OTP_REQUIRED,
            "TICK_ADMIN_OTP_REQUIRED is off: a staff password alone opens /admin/, where every "
            "tenant's data can be read and replayed.",
            "Leave TICK_ADMIN_OTP_REQUIRED unset (on unless DJANGO_DEBUG) and enrol staff with "
            "`manage.py otp_enrol <username>`.",
            checks.Warning,
        ),
    ),
    checks.Tags.security,
    deploy=True,
)
# Invitations and password resets travel by e-mail; the console backend loses them (and
# `make run` deliberately prints mail to the console).
check_email_configured = rules_check(
    (
        Rule(
            "tick.W021",
            lambda s: bool(s.EMAIL_URL),
            "EMAIL_URL is unset: invitation and password-reset mails are printed to the web "
            "process's console instead of being sent.",
            "Set EMAIL_URL, e.g. smtp://user:pass@smtp.example.com:587/?tls=1, and "
            "DEFAULT_FROM_EMAIL.",
            checks.Warning,
        ),
    ),
    checks.Tags.security,
    deploy=True,
)


# PostgreSQL settings below which Tick's write rate turns most WAL into full-page images:
# every page's first change after a checkpoint is logged whole, so checkpoints forced every
# few seconds by a small max_wal_size, or every few minutes by the timeout, multiply the WAL
# per occurrence (docs/operations.md "PostgreSQL settings").
PG_MIN_MAX_WAL_SIZE_MB = 4096
PG_MIN_CHECKPOINT_TIMEOUT_S = 600
_PG_SETTING_NAMES = ("max_wal_size", "checkpoint_timeout", "wal_compression")


_PG_HINT = 'Apply the settings in docs/operations.md "PostgreSQL settings".'
PG_RULES = (
    Rule(
        "tick.W030",
        lambda pg: pg.max_wal_size >= PG_MIN_MAX_WAL_SIZE_MB,
        "PostgreSQL max_wal_size is {s.max_wal_size} MB: at Tick's write rate it forces a "
        "checkpoint every few seconds, and most WAL becomes full-page images.",
        f"Set max_wal_size to at least {PG_MIN_MAX_WAL_SIZE_MB // 1024} GB. {_PG_HINT}",
        checks.Warning,
    ),
    Rule(
        "tick.W031",
        lambda pg: pg.checkpoint_timeout >= PG_MIN_CHECKPOINT_TIMEOUT_S,
        "PostgreSQL checkpoint_timeout is {s.checkpoint_timeout} s: each checkpoint logs every "
        "page touched after it whole again, so WAL is mostly full-page images.",
        f"Set checkpoint_timeout to at least {PG_MIN_CHECKPOINT_TIMEOUT_S // 60} min. {_PG_HINT}",
        checks.Warning,
    ),
    Rule(
        "tick.W032",
        lambda pg: pg.wal_compression != "off",
        "PostgreSQL wal_compression is off: full-page images are written uncompressed.",
        f"Set wal_compression to lz4 (or pglz). {_PG_HINT}",
        checks.Warning,
    ),
)


def pg_settings_warnings(values: dict[str, str]) -> list[CheckMessage]:
    """Warnings for `SHOW`-style values (max_wal_size in MB, checkpoint_timeout in s, as
    `pg_settings.setting` gives them)."""
    pg = SimpleNamespace(
        max_wal_size=int(values.get("max_wal_size", "0")),
        checkpoint_timeout=int(values.get("checkpoint_timeout", "0")),
        wal_compression=values.get("wal_compression", "off"),
    )
    return broken(PG_RULES, pg)


@checks.register(checks.Tags.database)
def check_pg_settings(
    app_configs: Apps = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Runs where database checks run (`migrate`, `check --database default`)."""
    if not databases or "default" not in databases:
        return []
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", [list(_PG_SETTING_NAMES)]
        )
        return pg_settings_warnings(dict(cursor.fetchall()))
