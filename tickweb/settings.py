"""Tick settings: one module, every deploy-specific value read from the environment.

Grouped by concern: Django core, database, security, REST API, Celery/RabbitMQ, Tick's
pipeline, observability. Invariants between values are enforced by tickweb/checks.py.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import dj_database_url
import dj_email_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured

from tickweb.env import env_bool, env_int, env_list, env_str

# Lets admin.ModelAdmin[Model] and friends be subscripted at runtime (types for mypy).
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent

# --- Django core ------------------------------------------------------------------------
DEBUG = env_bool("DJANGO_DEBUG", False)

INSTALLED_APPS = [
    # django.contrib.admin; its site asks staff for a TOTP code (tickweb/admin_site.py).
    "tickweb.apps.TickAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_results",
    "django_prometheus",
    # Content-Security-Policy header (CSPMiddleware below) and its settings checks.
    "csp",
    "apps.tenants",
    "apps.schedules",
    "apps.occurrences",
    # Server-rendered tenant pages (apps/*/views.py, templates/), htmx vendored by django-htmx.
    "django_htmx",
    # Login throttling (django-axes) and the admin's second factor (django-otp, TOTP only):
    # "login throttling and two-factor" under --- security --- below.
    "axes",
    "django_otp",
    "django_otp.plugins.otp_totp",
    # Registers the system checks of tickweb/checks.py.
    "tickweb.apps.TickwebConfig",
]
# The benchmarks (apps/bench/: the bench_* commands, their code and tests) are no part of the
# product: installed only when TICK_BENCH is on, which it is by default with DJANGO_DEBUG
# (`make run`, `make test`); a production deployment never lists them (docs/decisions.md).
TICK_BENCH = env_bool("TICK_BENCH", DEBUG)
if TICK_BENCH:
    INSTALLED_APPS.append("apps.bench")

MIDDLEWARE = [
    # Before/After pair: the Prometheus middleware times everything in between.
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # A NUL in the path or query is a 400 before any view or query runs (tickweb/middleware.py).
    "tickweb.middleware.RejectNulMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Row-level security for the rest of the request (apps/tenants/rls.py): the web role,
    # the signed-in user, the tenant once a door resolves it.
    "apps.tenants.rls_middleware.TenantRLSMiddleware",
    # request.user.is_verified(): whether this session passed a TOTP device (admin site).
    "django_otp.middleware.OTPMiddleware",
    # Staff's view of every tenant on the admin's pages, after the second factor (a claim the
    # database checks: apps/tenants/rls.py).
    "apps.tenants.rls_middleware.StaffRLSMiddleware",
    # Records the signed-in user's session for the account page's session list (docs/ui.md).
    "apps.tenants.middleware.UserSessionMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Content-Security-Policy on every response (docs/security.md "CSP and headers").
    "csp.middleware.CSPMiddleware",
    # Innermost (closest to the views): turns a login refused for lockout into the 429 page.
    "axes.middleware.AxesMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "tickweb.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "tickweb.wsgi.application"
ASGI_APPLICATION = "tickweb.asgi.application"

LANGUAGE_CODE = "en-us"
# UTC everywhere; local wall-clock time exists only inside apps/schedules/timerules/.
# In this zone DRF writes every instant as RFC 3339 with `Z`, the API's one timestamp
# format (docs/api.md; timerules.instant_text writes the hand-made ones alike).
TIME_ZONE = "UTC"
USE_I18N = False
# The admin's dates in the tenant pages' one format (tickweb/formats/en/formats.py).
FORMAT_MODULE_PATH = "tickweb.formats"
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# The web UI has its own login page (docs/ui.md); the admin keeps Django's.
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"
# Invitation links (apps/tenants/members.py) stop working this many days after they are sent.
TICK_INVITATION_TTL_DAYS = env_int("TICK_INVITATION_TTL_DAYS", 7)
# Invitation mails (new and re-sent) one tenant may send per hour; more answer 429.
TICK_INVITATION_MAILS_PER_HOUR = env_int("TICK_INVITATION_MAILS_PER_HOUR", 20)
# A user's session row (apps/tenants/models.py: UserSession) is refreshed at most this often.
TICK_SESSION_SEEN_RESOLUTION_S = env_int("TICK_SESSION_SEEN_RESOLUTION_S", 300)
# Password-reset links expire after this many seconds (Django's setting; default 1 day here).
PASSWORD_RESET_TIMEOUT = env_int("PASSWORD_RESET_TIMEOUT", 24 * 3600)

# --- e-mail -----------------------------------------------------------------------------
# One URL (dj-email-url): smtp://user:pass@host:587/?tls=1, smtp://host:465/?ssl=1,
# console:// … Unset: the console backend (mail printed by the web process, as under
# `make run`); tickweb/checks.py warns about that when DEBUG is off. Tests use locmem.
EMAIL_URL = env_str("EMAIL_URL", "")
_email = dj_email_url.parse(EMAIL_URL or "console://")
EMAIL_BACKEND = _email["EMAIL_BACKEND"]
EMAIL_HOST = _email["EMAIL_HOST"] or "localhost"
EMAIL_PORT = _email["EMAIL_PORT"] or 25
EMAIL_HOST_USER = _email["EMAIL_HOST_USER"] or ""
EMAIL_HOST_PASSWORD = _email["EMAIL_HOST_PASSWORD"] or ""
EMAIL_USE_TLS = _email["EMAIL_USE_TLS"]
EMAIL_USE_SSL = _email["EMAIL_USE_SSL"]
EMAIL_TIMEOUT = _email["EMAIL_TIMEOUT"] or 10
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "Tick <tick@localhost>")

# --- database ---------------------------------------------------------------------------
DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/tick"),
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 60),
        conn_health_checks=True,
    )
}
# Behind a transaction-mode pooler (PgBouncer, docs/operations.md "PgBouncer"): no state may
# outlive a transaction. Django's server-side cursors (`.iterator()`) would be declared in
# one transaction and fetched in another, and psycopg's automatic prepared statements live
# on a server connection PgBouncer 1.18 hands to others (docs/decisions.md "PgBouncer").
# Connected directly, the worker's per-occurrence statements are prepared on the connection
# (apps/occurrences/execution/statements.py; every other statement is still bound
# client-side by Django, which never prepares); behind the pooler nothing is.
DATABASE_POOLER = env_str("DATABASE_POOLER", "")
if DATABASE_POOLER == "transaction":
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = None
elif DATABASE_POOLER:
    raise ImproperlyConfigured("DATABASE_POOLER must be 'transaction' or empty")
else:
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = 5
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Row-level security (docs/decisions.md "Row-level security", apps/tenants/rls.py): web
# requests run as this role, which the tenant policies restrict; the migrations create it if
# missing and grant it the tables. Web processes should connect as it (TICK_WEB_DATABASE_URL
# in docs/operations.md); the engine connects as the tables' owner, which the policies exempt.
TICK_DB_WEB_ROLE = env_str("TICK_DB_WEB_ROLE", "tick_web")

# --- security ---------------------------------------------------------------------------
SECRET_KEY = env_str("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DJANGO_DEBUG is off")
    # Development only: DEBUG on and no key given.
    SECRET_KEY = "django-insecure-development-only-key"  # noqa: S105
# Earlier keys still accepted while sessions and derived keys move to the new one
# (docs/security.md "Rotating keys and secrets"); comma-separated.
SECRET_KEY_FALLBACKS = env_list("SECRET_KEY_FALLBACKS", [])
# Webhook signing secrets are stored encrypted (apps/tenants/signing.py, docs/webhooks.md):
# comma-separated Fernet keys; the first encrypts, every one decrypts (add a new key first to
# rotate). Empty: a key derived from SECRET_KEY (and SECRET_KEY_FALLBACKS) is used. Those
# derived keys always decrypt too, so moving to an explicit key loses nothing.
TICK_SIGNING_KEYS = env_list("TICK_SIGNING_KEYS", [])
# After a rotation, the previous signing secret still signs for this long (unless revoked).
TICK_SIGNING_ROTATION_OVERLAP_S = env_int("TICK_SIGNING_ROTATION_OVERLAP_S", 86_400)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
# Production hardening (`manage.py check --deploy`); all on unless DEBUG, env-overridable.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31_536_000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", not DEBUG)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", not DEBUG)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
# Behind a TLS-terminating proxy set SECURE_PROXY_SSL_HEADER_ENABLED=1.
if env_bool("SECURE_PROXY_SSL_HEADER_ENABLED", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Content-Security-Policy (django-csp 4.x format; docs/security.md "CSP and headers"): only
# this origin's scripts, styles, images and XHRs; no inline script, style, handler or eval;
# no framing. Django admin needs nothing more; the Swagger UI view adds one style hash
# (tickweb/csp.py).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}
# The health/metrics scrape runs over plain HTTP inside the cluster; /metrics answers only
# the allowed networks or the token (TICK_METRICS_*, below).
SECURE_REDIRECT_EXEMPT = [r"^metrics$", r"^healthz$", r"^readyz$"]

# Login throttling and two-factor (docs/decisions.md "Login throttling and two-factor").
# django-axes counts failed passwords per username (not per IP: behind a proxy every client has
# the proxy's address, and X-Forwarded-For is not trusted anywhere) in PostgreSQL, so every web
# process shares the count. After TICK_LOGIN_FAILURE_LIMIT failures within the cool-off, /login/
# and /admin/login/ refuse that username, right password or not, with a 429 page saying when to
# retry; the lock lifts TICK_LOGIN_COOLOFF_S after the last counted failure, attempts made
# while locked do not extend it, and a successful login clears the count.
AUTHENTICATION_BACKENDS = [
    # First: refuses a locked-out username before any password is checked. It needs the request,
    # so authenticate() without one fails loudly instead of skipping the count.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
TICK_LOGIN_FAILURE_LIMIT = env_int("TICK_LOGIN_FAILURE_LIMIT", 5)
TICK_LOGIN_COOLOFF_S = env_int("TICK_LOGIN_COOLOFF_S", 15 * 60)
AXES_FAILURE_LIMIT = TICK_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(seconds=TICK_LOGIN_COOLOFF_S)
AXES_LOCKOUT_PARAMETERS = ["username"]
# axes.W006 asks for an ip_address key as well. Without a trusted X-Forwarded-For, the address
# is the proxy's: one busy office or one attacker would lock every account. Per-address limits
# belong to the proxy, which knows the client (docs/decisions.md).
SILENCED_SYSTEM_CHECKS = ["axes.W006"]
AXES_RESET_ON_SUCCESS = True
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_HTTP_RESPONSE_CODE = 429
AXES_LOCKOUT_CALLABLE = "apps.tenants.views.login_locked_out"
# No start-up banner from every process; failures and lockouts are still logged as warnings.
AXES_VERBOSE = False
# The admin site's TOTP requirement for staff: on unless DEBUG (`make run`'s demo stays a plain
# password). Devices are enrolled with `manage.py otp_enrol <username>` (docs/operations.md).
TICK_ADMIN_OTP_REQUIRED = env_bool("TICK_ADMIN_OTP_REQUIRED", not DEBUG)
# The name authenticator apps show beside the account.
OTP_TOTP_ISSUER = env_str("TICK_OTP_ISSUER", "Tick")
# The admin's device pages never show a TOTP secret or its QR code after enrolment.
OTP_ADMIN_HIDE_SENSITIVE_DATA = True

# --- REST API ---------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["apps.tenants.authentication.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["apps.tenants.authentication.IsTenantAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": None,
    "UNAUTHENTICATED_USER": None,
    # One JSON error shape for every 4xx (tickweb/exceptions.py).
    "EXCEPTION_HANDLER": "tickweb.exceptions.exception_handler",
    # JSON is the only response format too: no browsable API, so no HTML page on every GET
    # (docs/decisions.md "API documentation and the browsable API").
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # JSON is the only request format; tickweb/parsers.py caps its size and depth.
    "DEFAULT_PARSER_CLASSES": ["tickweb.parsers.TickJSONParser"],
    # Per-tenant rate limit counted in PostgreSQL, shared by every web process (ratelimit.py).
    "DEFAULT_THROTTLE_CLASSES": ["tickweb.ratelimit.ApiKeyRateThrottle"],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Tick API",
    "DESCRIPTION": "Multi-tenant scheduler: schedules, occurrences and their attempts; "
    "the account's members and invitations.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI assets come from a package and are served by the app: no CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Enums that share a field name get their own names: the schema is stable and warning-free.
    "ENUM_NAME_OVERRIDES": {
        "ScheduleStateEnum": "apps.schedules.models.Schedule.State",
        "OccurrenceStateEnum": "apps.occurrences.models.Occurrence.State",
        "InvitationStateEnum": "apps.tenants.models.Invitation.State",
        "RoleEnum": "apps.tenants.models.Membership.Role",
        # Alerts: a channel's kind beside the schedule's, a rule's events beside the history's.
        "AlertChannelKindEnum": "apps.occurrences.models.AlertChannel.Kind",
        "AlertEventEnum": "apps.occurrences.models.AlertEvent",
        "AlertRuleEventEnum": "apps.occurrences.alerts.serializers.RULE_EVENT_CHOICES",
        "KindEnum": "apps.occurrences.schedules.serializers.KIND_IN",
        "AlertDeliveryStateEnum": "apps.occurrences.models.AlertDelivery.State",
    },
}
# Request bodies above this answer 413 (a schedule with a 64 KiB payload fits with room).
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("DATA_UPLOAD_MAX_MEMORY_SIZE", 256 * 1024)
TICK_MAX_PAYLOAD_BYTES = env_int("TICK_MAX_PAYLOAD_BYTES", 64 * 1024)
TICK_MAX_JSON_DEPTH = env_int("TICK_MAX_JSON_DEPTH", 32)
# Idempotency keys are honoured this long (the contract promises at least 24 h).
TICK_IDEMPOTENCY_TTL_S = max(env_int("TICK_IDEMPOTENCY_TTL_S", 48 * 3600), 24 * 3600)
# Receipts look this far back for in-flight occurrences of the changed schedule.
TICK_RECEIPT_LOOKBACK_S = env_int("TICK_RECEIPT_LOOKBACK_S", 24 * 3600)
# One backfill request runs at most this many instants (more: 400 naming the maximum).
TICK_BACKFILL_MAX_INSTANTS = env_int("TICK_BACKFILL_MAX_INSTANTS", 1000)
# Run-now requests one schedule accepts per minute (a sliding minute; 429 beyond it, replays
# of a request id not counted): a button or a loop cannot queue runs faster than they matter.
TICK_RUN_NOW_PER_MIN = env_int("TICK_RUN_NOW_PER_MIN", 10)
# Bulk changes (apps/occurrences/bulk_changes.py): schedules per batch (pause, resume and
# cancel change those with nothing to recall in one transaction per run), and how long
# `manage.py bulk` holds a job without renewing it: a killed process's job is taken up by
# the next one after this.
TICK_BULK_BATCH = env_int("TICK_BULK_BATCH", 1000)
TICK_BULK_LEASE_S = env_int("TICK_BULK_LEASE_S", 30)
# A bulk shares the machine with the pipeline: it works this share of the time (rests in
# proportion after each transaction; 100 = never rests), and waits at most this long after
# each transaction while the relay has due rows waiting (0 = never waits).
TICK_BULK_DUTY_PCT = env_int("TICK_BULK_DUTY_PCT", 50)
TICK_BULK_YIELD_MS = env_int("TICK_BULK_YIELD_MS", 5000)

# --- Celery / RabbitMQ ------------------------------------------------------------------
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A worker whose broker is down reconnects until it is back (never gives up and exits).
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
# JSON only, results too: a pickled message is refused before it is deserialized.
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_SERIALIZER = "json"
CELERY_RESULT_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_BACKEND = "django-db"
CELERY_RESULT_EXTENDED = False
CELERY_TASK_IGNORE_RESULT = True
# A handler's side effect happens before the ack; a killed worker gets its message redelivered
# (the claim then drops it as a duplicate, and the lease reaper recovers the occurrence).
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# Handlers can run for hours: a worker reserves one message per pool slot per queue. Per queue:
# the lanes are quorum queues, which refuse a channel-wide prefetch, so Celery applies it to
# each queue's consumer and a busy worker may hold messages it cannot start yet
# (docs/decisions.md "Strict capacity reserved at the workers").
CELERY_WORKER_PREFETCH_MULTIPLIER = env_int("CELERY_WORKER_PREFETCH_MULTIPLIER", 1)
# Celery's Django fixup closes every database connection before and after each task unless
# this is set: a new PostgreSQL backend per occurrence cost more server CPU than the claim and
# completion together (docs/decisions.md "Workers keep their database connection"). Set, it
# closes only every this many tasks; tickweb/celery.py closes per CONN_MAX_AGE and on errors
# as Django does per request.
CELERY_DB_REUSE_MAX = 1_000_000
# Tick sends no ETA tasks: without Celery's delayed-delivery step a worker consumes at once
# after failing over to another node (apps/occurrences/execution/worker_consumer.py).
CELERY_WORKER_CONSUMER = "apps.occurrences.execution.worker_consumer:TickConsumer"
# Tenant partitions per lane: queue = <prefix>.<lane>.p<H(tenant) mod P>.
TICK_QUEUE_PREFIX = env_str("TICK_QUEUE_PREFIX", "tick")
TICK_TENANT_PARTITIONS = env_int("TICK_TENANT_PARTITIONS", 4)
# Workers consume every Tick queue (declared in tickweb/celery.py, so settings import no app
# module); the relay publishes to them directly.
CELERY_TASK_DEFAULT_QUEUE = f"{TICK_QUEUE_PREFIX}.strict.p0"

# --- Tick pipeline ----------------------------------------------------------------------
# Logical shards: shard = H(schedule_id) mod N. Fixed at installation; changing it re-homes
# every schedule, so it is read once here and never per call.
TICK_SHARDS = env_int("TICK_SHARDS", 256)
# Shard leases of materializer and relay processes; a dead owner's shards are free after it.
TICK_LEASE_TTL_S = env_int("TICK_LEASE_TTL_S", 15)

# Materializer. How far ahead it writes occurrences (seconds): covers a lease failover (TTL)
# plus the queue-write budget; short enough that updates supersede few rows.
TICK_PLANNING_WINDOW_S = env_int("TICK_PLANNING_WINDOW_S", 120)
# A schedule taken up (its next instant inside the window) is written this much further: up
# to window + span ahead, cut at a point of its shard's phase, so one that fires more often
# than the span is advanced once per span, not once per instant (docs/decisions.md "Fewer
# advances: a schedule written a span ahead"). 0: each instant as it enters the window.
TICK_PLANNING_SPAN_S = env_int("TICK_PLANNING_SPAN_S", 240)
TICK_MATERIALIZE_BATCH = env_int("TICK_MATERIALIZE_BATCH", 2000)
# Upper bound on occurrences written for one schedule in one pass (bounds a tight cron).
TICK_MAX_FIRES_PER_PASS = env_int("TICK_MAX_FIRES_PER_PASS", 200)
# Misfire bookkeeping: at most this many MISSED rows per schedule per recovery pass.
TICK_MISSED_RECORD_LIMIT = env_int("TICK_MISSED_RECORD_LIMIT", 10)

# Relay. The look-ahead lets it read a burst and build its messages before the instant.
TICK_RELAY_LOOKAHEAD_MS = env_int("TICK_RELAY_LOOKAHEAD_MS", 5000)
TICK_RELAY_BATCH = env_int("TICK_RELAY_BATCH", 100_000)
# Occurrences of one tenant and lane due at one instant share a message, up to this many.
TICK_RELAY_ENVELOPE_MAX = env_int("TICK_RELAY_ENVELOPE_MAX", 50)
# Staging (apps/occurrences/pipeline/staging.py): an instant with at least MIN_ROWS on-time
# rows within HORIZON_S is read in chunks of CHUNK rows before it comes, at most MAX_ROWS
# (the relay's memory bound: ~1 KiB per staged row, docs/performance.md).
TICK_RELAY_STAGE_MIN_ROWS = env_int("TICK_RELAY_STAGE_MIN_ROWS", 10_000)
TICK_RELAY_STAGE_CHUNK = env_int("TICK_RELAY_STAGE_CHUNK", 50_000)
TICK_RELAY_STAGE_HORIZON_S = env_int("TICK_RELAY_STAGE_HORIZON_S", 60)
TICK_RELAY_STAGE_MAX_ROWS = env_int("TICK_RELAY_STAGE_MAX_ROWS", 600_000)

# Worker: attempt leases (renewed every third of it), retries and their deadline.
TICK_ATTEMPT_LEASE_S = env_int("TICK_ATTEMPT_LEASE_S", 60)
TICK_MAX_ATTEMPTS = env_int("TICK_MAX_ATTEMPTS", 5)
TICK_RETRY_BASE_S = env_int("TICK_RETRY_BASE_S", 2)
TICK_RETRY_CAP_S = env_int("TICK_RETRY_CAP_S", 600)
# No retry is scheduled later than this after scheduled_for (or after a DLQ replay).
TICK_RETRY_DEADLINE_S = env_int("TICK_RETRY_DEADLINE_S", 86_400)
# Over-quota claims (Tenant.max_running) are re-queued this much later (plus jitter).
TICK_QUOTA_DELAY_S = env_int("TICK_QUOTA_DELAY_S", 2)
# Fair share of worker slots (apps/occurrences/execution/presence.py): below
# max(1, floor(capacity x share)) running attempts a tenant always claims; at or above it, it
# is delayed like an over-quota claim only while another tenant has work waiting now, and then
# only at its max-min allocation of the capacity over the waiting tenants. 0.5: with two
# tenants, neither is held below half the slots. A tenant alone may use every slot.
# Capacity = TICK_WORKER_SLOTS when set (> 0), else the slots of the live workers, which
# announce themselves every INTERVAL and stop counting when unseen for TTL; with no live
# worker (capacity unknown) only Tenant.max_running applies.
TICK_TENANT_SLOT_SHARE = float(env_str("TICK_TENANT_SLOT_SHARE", "0.5"))
# Strict capacity reserved at the workers: recovery work (catch-up lane, retries) may hold at
# most the live slots left once this share is kept for on-time runs (at least 1 slot), in all
# and on each worker.
TICK_STRICT_RESERVED_SHARE = float(env_str("TICK_STRICT_RESERVED_SHARE", "0.5"))
# An occurrence the share defers after waiting longer than this while a slot is free is
# counted (tick_deferred_beside_free_slots_total, alert TickDeferredBesideFreeSlots).
TICK_DEFERRAL_ALERT_S = env_int("TICK_DEFERRAL_ALERT_S", 60)
TICK_WORKER_SLOTS = env_int("TICK_WORKER_SLOTS", 0)
TICK_WORKER_PRESENCE_INTERVAL_S = env_int("TICK_WORKER_PRESENCE_INTERVAL_S", 10)
TICK_WORKER_PRESENCE_TTL_S = env_int("TICK_WORKER_PRESENCE_TTL_S", 30)
# A worker retries a database outage this long (backoff) before handing the message back.
TICK_WORKER_OUTAGE_RETRY_S = env_int("TICK_WORKER_OUTAGE_RETRY_S", 60)
# A worker's connections are replaced after this many seconds (its CONN_MAX_AGE; the other
# processes keep DATABASE_CONN_MAX_AGE): each replacement is a new backend that loads its
# caches and prepares the claim's statements again (docs/decisions.md "Workers keep their
# database connection").
TICK_WORKER_CONN_MAX_AGE = env_int("TICK_WORKER_CONN_MAX_AGE", 600)
# Group commit of successful completions in a pool process (execution/complete_batch.py):
# queued ones are written together every this many ms (0: each completes at once, the
# default: docs/decisions.md "Claim and completion in fewer round trips"), at once when this
# many are queued.
TICK_COMPLETION_GROUP_MS = env_int("TICK_COMPLETION_GROUP_MS", 0)
TICK_COMPLETION_GROUP_MAX = env_int("TICK_COMPLETION_GROUP_MAX", 200)
# Envelope runs (apps/occurrences/execution/envelope_run.py): a slot that receives an
# envelope claims, runs and completes together as many of its items as this pool process
# has seen their handlers finish within this many ms (95th percentile, after
# TICK_ENVELOPE_RUN_SAMPLES runs); 0 turns runs off (every envelope fans out).
TICK_ENVELOPE_RUN_BUDGET_MS = env_int("TICK_ENVELOPE_RUN_BUDGET_MS", 200)
TICK_ENVELOPE_RUN_SAMPLES = env_int("TICK_ENVELOPE_RUN_SAMPLES", 20)
# Handler deadlines (apps/occurrences/execution/deadlines.py): at its run-time limit a handler
# is told to stop; one still running this much later is reclaimed (attempt TIMED_OUT, the
# prefork pool process replaced).
TICK_HANDLER_TIMEOUT_GRACE_S = env_int("TICK_HANDLER_TIMEOUT_GRACE_S", 10)
# QUEUE_ONE: a WAITING occurrence re-checks this often even if no completion wakes it.
TICK_OVERLAP_RECHECK_S = env_int("TICK_OVERLAP_RECHECK_S", 30)
# How far back overlap checks look for a RUNNING/WAITING occurrence of the schedule.
TICK_OVERLAP_LOOKBACK_S = env_int("TICK_OVERLAP_LOOKBACK_S", 2 * 86_400)
# Webhook handler: timeouts, and the operator's SSRF allowlist (CIDRs and/or host names,
# comma-separated). Empty = only public unicast addresses are reachable.
TICK_WEBHOOK_CONNECT_TIMEOUT_S = float(env_str("TICK_WEBHOOK_CONNECT_TIMEOUT_S", "5"))
TICK_WEBHOOK_READ_TIMEOUT_S = float(env_str("TICK_WEBHOOK_READ_TIMEOUT_S", "30"))
TICK_WEBHOOK_ALLOWLIST = env_list("TICK_WEBHOOK_ALLOWLIST", [])
# Every outbound HTTP call (a webhook handler's, an alert webhook's) ends by this many seconds,
# DNS lookup to last byte, whatever the receiver does (apps/occurrences/execution/egress.py).
TICK_EGRESS_DEADLINE_S = float(env_str("TICK_EGRESS_DEADLINE_S", "40"))
# Demo handlers (apps/occurrences/execution/demo_handlers.py) offered beside `noop` and
# `webhook`: `record` sleeps and fails as the tenant's payload asks, so only a debug run
# (`make run`, `make test`) has it by default. Comma-separated; once set, even to "", it
# replaces the default in either mode.
TICK_EXTRA_HANDLERS = [
    name.strip()
    for name in env_str("TICK_EXTRA_HANDLERS", "record" if DEBUG else "").split(",")
    if name.strip()
]

# Reaper backstop (`manage.py reap`): ENQUEUED this long after its last broker confirm with
# no claim = the broker lost it; republished with the same id. Above the worst queue wait.
TICK_REDELIVER_AFTER_S = env_int("TICK_REDELIVER_AFTER_S", 600)
# The backstop looks back TICK_RETRY_DEADLINE_S by instant on each pass; every this often it
# reads every partition (older backfilled instants, rows left across a long outage).
TICK_REDELIVER_DEEP_EVERY_S = env_int("TICK_REDELIVER_DEEP_EVERY_S", 600)

# Daily occurrence partitions (`manage.py partitions`): created ahead, dropped after retention.
TICK_PARTITION_DAYS_AHEAD = env_int("TICK_PARTITION_DAYS_AHEAD", 7)
TICK_RETENTION_DAYS = env_int("TICK_RETENTION_DAYS", 30)

# Reconciliation audit (`manage.py reconcile`): seconds before pending work counts as stuck.
# ENQUEUED with no attempt: above the worst legitimate queue wait and the retry cap.
TICK_AUDIT_ENQUEUED_BOUND_S = env_int("TICK_AUDIT_ENQUEUED_BOUND_S", 900)
# SCHEDULED / RETRY_WAIT past due and unpublished: the relay publishes within seconds.
TICK_AUDIT_SCHEDULED_BOUND_S = env_int("TICK_AUDIT_SCHEDULED_BOUND_S", 300)
# RUNNING past its lease's expiry: the reaper takes it within its grace.
TICK_AUDIT_RUNNING_BOUND_S = env_int("TICK_AUDIT_RUNNING_BOUND_S", 300)
# An ACTIVE schedule's next_run_at this far in the past: the materializer is behind or down.
TICK_AUDIT_MATERIALIZE_LAG_S = env_int("TICK_AUDIT_MATERIALIZE_LAG_S", 300)

# --- alerts (docs/alerts.md) ------------------------------------------------------------
# A channel's first pending alert waits this long for others to join it in one message.
TICK_ALERT_COALESCE_S = env_int("TICK_ALERT_COALESCE_S", 10)
# At most one message per channel per interval; what fires meanwhile goes out as one digest.
TICK_ALERT_CHANNEL_INTERVAL_S = env_int("TICK_ALERT_CHANNEL_INTERVAL_S", 60)
# Sends of one message before it is FAILED (transient errors back off 2^n s, at most 10 min).
TICK_ALERT_MAX_ATTEMPTS = env_int("TICK_ALERT_MAX_ATTEMPTS", 8)
# Alert messages of one tenant being sent at once, across all workers: a slow or hostile
# receiver holds at most this many worker slots (each for TICK_EGRESS_DEADLINE_S at most).
TICK_ALERT_TENANT_SENDS = env_int("TICK_ALERT_TENANT_SENDS", 1)
# Test alerts one tenant may request per hour, and confirmation mails of e-mail channels it
# may have sent per hour; more answer 429.
TICK_ALERT_TESTS_PER_HOUR = env_int("TICK_ALERT_TESTS_PER_HOUR", 10)
TICK_ALERT_CONFIRMATIONS_PER_HOUR = env_int("TICK_ALERT_CONFIRMATIONS_PER_HOUR", 10)
# A digest lists this many alerts and counts the rest.
TICK_ALERT_DIGEST_LIST_MAX = env_int("TICK_ALERT_DIGEST_LIST_MAX", 50)
# Lag rules are evaluated this often by the reaper.
TICK_ALERT_LAG_EVERY_S = env_int("TICK_ALERT_LAG_EVERY_S", 30)
# Links in alerts point here (the tenant UI); empty = no links.
TICK_PUBLIC_URL = env_str("TICK_PUBLIC_URL", "http://127.0.0.1:8000")
# E-mail alerts go out through EMAIL_URL (the e-mail section above); a worker waits at most
# EMAIL_TIMEOUT seconds for the server, then the send is retried with back-off (docs/alerts.md).

# --- observability ----------------------------------------------------------------------
# Who may read the web's /metrics (docs/security.md "Metrics"): requests straight from these
# networks (comma-separated CIDRs; never one that came through a proxy) or carrying
# `Authorization: Bearer <TICK_METRICS_TOKEN>`; everyone else gets a 404.
TICK_METRICS_ALLOWED_NETWORKS = env_list(
    "TICK_METRICS_ALLOWED_NETWORKS", ["127.0.0.0/8", "::1/128"]
)
TICK_METRICS_TOKEN = env_str("TICK_METRICS_TOKEN", "")
# Tenant-labelled metrics keep the top N tenants by value and sum the rest as "other".
TICK_METRICS_TOP_TENANTS = env_int("TICK_METRICS_TOP_TENANTS", 10)
# Structured logs: every record carries tenant/schedule/occurrence ids ("-" when the line is
# about a batch); key=value text by default, one JSON object per line with LOG_FORMAT=json.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"tick_ids": {"()": "apps.occurrences.observability.logs.IdsFilter"}},
    "formatters": {
        "kv": {
            "format": "%(asctime)s %(levelname)s %(name)s tenant=%(tenant_id)s "
            "schedule=%(schedule_id)s occurrence=%(occurrence_id)s %(message)s"
        },
        "json": {"()": "apps.occurrences.observability.logs.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "filters": ["tick_ids"],
            "formatter": "json" if env_str("LOG_FORMAT", "kv") == "json" else "kv",
        }
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}
