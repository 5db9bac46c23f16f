"""Tenants, their members and their API keys."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import cast

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.contrib.postgres.fields import ArrayField
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models.functions import Lower

from apps.tenants.readable import instant_text
from apps.tenants.text import refuse_control_characters

# The most extra webhook ports one tenant may open (Tenant.webhook_allowed_ports).
MAX_WEBHOOK_PORTS = 20
# The most API keys one tenant may hold at once (neither revoked nor expired): a key is a
# credential someone must answer for, not a counter.
MAX_ACTIVE_API_KEYS = 50

# The longest names an actor string carries: a username (Django's column) and an e-mail
# address (Django's validator refuses one over 320 characters, RFC 3696's bound).
USERNAME_MAX_LENGTH = cast(int, AbstractUser.username.field.max_length)
EMAIL_ADDRESS_MAX_LENGTH = 320
# Every column that stores an actor (the event logs, BulkChange, Invitation.invited_by) holds
# the longest one Tick writes whole: "support:" + a username, or "email:" + the address that
# confirmed an alert channel (docs/decisions.md "One bound for actor strings").
ACTOR_MAX_LENGTH = max(
    len("support:") + USERNAME_MAX_LENGTH, len("email:") + EMAIL_ADDRESS_MAX_LENGTH
)


class Tenant(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200, validators=[refuse_control_characters])
    created_at = models.DateTimeField(auto_now_add=True)

    # Quotas (enforcement: docs/decisions.md). Rates are per second; breaches are refused (429)
    # or delayed, counted.
    max_active_schedules = models.PositiveIntegerField(default=10_000)
    trigger_rate_per_s = models.PositiveIntegerField(default=1_000)
    max_running = models.PositiveIntegerField(default=100)
    catchup_rate_per_s = models.PositiveIntegerField(default=50)
    # A rule whose consecutive fires come closer than this is refused at the API (400).
    min_interval_s = models.PositiveIntegerField(default=60)
    # API requests per minute of the tenant, all its keys together (fixed window in
    # PostgreSQL; 429 + Retry-After).
    api_rate_per_min = models.PositiveIntegerField(default=600)
    # Transient-failure retries per UTC hour; beyond it a failing occurrence goes DEAD.
    retry_budget_per_hour = models.PositiveIntegerField(default=1_000)
    # Longest run-time limit a schedule of this tenant may ask for (`Schedule.timeout_s`).
    max_timeout_s = models.PositiveIntegerField(default=3_600)
    # Labels one schedule may carry (apps/schedules/labels.py).
    max_labels_per_schedule = models.PositiveSmallIntegerField(default=10)
    # A new schedule's "pause after N consecutive DEAD occurrences" (0 = off).
    pause_after_dead = models.PositiveSmallIntegerField(default=0)
    # Ports a webhook of this tenant may call besides 80 and 443 (SSRF guard: a port names a
    # service, and internal ones such as 6379 or 5432 stay closed unless an operator opens
    # them here). Checked at create/update/preview and again at each send.
    webhook_allowed_ports = ArrayField(
        models.PositiveIntegerField(validators=[MinValueValidator(1), MaxValueValidator(65535)]),
        size=MAX_WEBHOOK_PORTS,
        default=list,
        blank=True,
        help_text="Extra TCP ports (1–65535, comma-separated) webhooks may call besides 80 and "
        "443. Empty: only 80 and 443.",
    )

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    class Role(models.TextChoices):
        ADMIN = "admin", "Admin"
        VIEWER = "viewer", "Viewer"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_user_tenant_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant} ({self.role})"


class ApiKey(models.Model):
    """A tenant's API key. Only a SHA-256 of the secret is stored; the key is shown once.

    The secret has 256 bits of entropy, so a fast hash is enough: there is nothing to
    brute-force, and authentication stays one indexed lookup per request.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, validators=[refuse_control_characters])
    # Visible part of the key ("tick_" + 8 chars), for people to tell keys apart.
    prefix = models.CharField(max_length=16, db_index=True)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    # What the key may do in the account API (members, invitations): a viewer key reads them
    # and changes nothing. Existing keys were full credentials, so the default stays admin.
    role = models.CharField(
        max_length=16, choices=Membership.Role.choices, default=Membership.Role.ADMIN
    )
    # The member who created it in the web UI; NULL for an operator's key (manage.py). The
    # key is theirs: revoked when they leave the tenant, and an admin key when they are
    # demoted (apps/tenants/services.py `member_keys_revoke`).
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+",
    )  # fmt: skip

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name})"


class IdempotencyKey(models.Model):
    """One `Idempotency-Key` of one tenant: the lock row concurrent retries queue on, and the
    first successful response they replay. Rows older than TICK_IDEMPOTENCY_TTL_S are treated
    as absent and purged by `manage.py idempotency_purge`."""

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    # SHA-256 of method, path and the canonical JSON body: "same body" means same request.
    request_hash = models.CharField(max_length=64)
    # NULL until the first request with this key succeeded; failures store nothing.
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    response = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "key"], name="idempotency_tenant_key_uniq")
        ]
        indexes = [
            # `manage.py idempotency_purge`: expired rows, oldest first.
            models.Index(fields=["created_at"], name="idempotency_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}:{self.key}"


class ApiRateWindow(models.Model):
    """A tenant's API request counter of the current fixed window (one row per tenant,
    upserted): every key of the tenant counts against one limit."""

    tenant = models.OneToOneField(
        Tenant, on_delete=models.CASCADE, primary_key=True, related_name="+"
    )
    window_start = models.DateTimeField()
    count = models.PositiveIntegerField()

    def __str__(self) -> str:
        return f"{self.tenant_id} {instant_text(self.window_start)} x{self.count}"


class TenantEvent(models.Model):
    """Append-only audit log of account-level changes (keys, members, settings), with who did it.

    The account's counterpart of the schedules' event log: support actions in the admin and
    the tenant's own admins write here, and the UI shows it.
    """

    class Kind(models.TextChoices):
        API_KEY_CREATED = "api_key_created", "API key created"
        API_KEY_REVOKED = "api_key_revoked", "API key revoked"
        API_KEY_EXPIRY_SHORTENED = "api_key_expiry_shortened", "API key expiry shortened"
        MEMBER_INVITED = "member_invited", "Member invited"
        INVITATION_RESENT = "invitation_resent", "Invitation re-sent"
        INVITATION_REVOKED = "invitation_revoked", "Invitation revoked"
        INVITATION_ACCEPTED = "invitation_accepted", "Invitation accepted"
        MEMBER_ROLE_CHANGED = "member_role_changed", "Member role changed"
        MEMBER_REMOVED = "member_removed", "Member removed"
        PASSWORD_CHANGED = "password_changed", "Password changed"
        SESSIONS_REVOKED = "sessions_revoked", "Signed out everywhere"
        SETTINGS_CHANGED = "settings_changed", "Settings changed"
        SIGNING_SECRET_CREATED = "signing_secret_created", "Signing secret created"
        SIGNING_SECRET_ROTATED = "signing_secret_rotated", "Signing secret rotated"
        SIGNING_SECRET_REVOKED = "signing_secret_revoked", "Signing secret revoked"
        ALERT_CHANNEL_CHANGED = "alert_channel_changed", "Alert channel changed"
        ALERT_RULE_CHANGED = "alert_rule_changed", "Alert rule changed"
        OCCURRENCES_REPLAYED = "occurrences_replayed", "Occurrences replayed by support"

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=32, choices=Kind.choices)
    actor = models.CharField(max_length=ACTOR_MAX_LENGTH)
    at = models.DateTimeField()
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "at"], name="tenant_event_at_idx")]
        ordering = ["tenant", "at", "id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.tenant_id} by {self.actor}"


class SigningSecret(models.Model):
    """A tenant's webhook signing secret (docs/webhooks.md).

    Workers need the secret itself to compute the HMAC, so it cannot be stored as a hash: it is
    stored encrypted (Fernet, keys from settings: `apps/tenants/signing.py`), and only its
    visible prefix is stored in clear. Active = not revoked and not past `expires_at`; at most
    two are active at once (the current one and, during a rotation, the previous one).
    """

    class Status(models.TextChoices):
        """Derived from the timestamps (`status_at`), never stored."""

        ACTIVE = "active", "Active"
        EXPIRED = "expired", "Expired"
        REVOKED = "revoked", "Revoked"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="signing_secrets")
    # "whsec_" + the first 6 characters: enough to tell secrets apart, nothing to verify with.
    prefix = models.CharField(max_length=16)
    secret_encrypted = models.TextField()
    created_at = models.DateTimeField()
    # NULL: the current secret, valid until a rotation or a revocation.
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # Every webhook send reads the tenant's active secrets; the pages list them newest
            # first.
            models.Index(fields=["tenant", "created_at"], name="signing_secret_tenant_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.tenant_id})"

    def status_at(self, now: datetime) -> SigningSecret.Status:
        if self.revoked_at is not None:
            return SigningSecret.Status.REVOKED
        if self.expires_at is not None and self.expires_at <= now:
            return SigningSecret.Status.EXPIRED
        return SigningSecret.Status.ACTIVE


class Invitation(models.Model):
    """An e-mailed invitation to join a tenant with a role (docs/decisions.md: invitations).

    Only a SHA-256 of the link's random token is stored: the link is shown nowhere but in the
    mail. Single use (`accepted_at`), revocable, expiring; a re-send replaces the token, so
    only the newest link works.
    """

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        EXPIRED = "expired", "Expired"
        ACCEPTED = "accepted", "Accepted"
        REVOKED = "revoked", "Revoked"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField(max_length=254)
    role = models.CharField(max_length=16, choices=Membership.Role.choices)
    token_hash = models.CharField(max_length=64, unique=True)
    invited_by = models.CharField(max_length=ACTOR_MAX_LENGTH)
    created_at = models.DateTimeField()
    sent_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # One open invitation per address and tenant: inviting again is a re-send.
            models.UniqueConstraint(
                Lower("email"),
                "tenant",
                name="invitation_open_email_uniq",
                condition=models.Q(accepted_at__isnull=True, revoked_at__isnull=True),
            )
        ]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.email} → {self.tenant_id} ({self.role})"

    @property
    def inviter(self) -> str:
        """Who to name in the mail and on the accept page: "user:ana" → "ana"; an API key
        is no person to name."""
        who, _, name = self.invited_by.partition(":")
        return name if who == "user" and name else f"An admin of {self.tenant.name}"

    def state_at(self, now: datetime) -> Invitation.State:
        if self.accepted_at is not None:
            return Invitation.State.ACCEPTED
        if self.revoked_at is not None:
            return Invitation.State.REVOKED
        if self.expires_at <= now:
            return Invitation.State.EXPIRED
        return Invitation.State.PENDING


class UserSession(models.Model):
    """A signed-in session of a user, so the account page can list and end them: Django's
    session table cannot be searched by user. Written by `UserSessionMiddleware` at login and
    then at most every TICK_SESSION_SEEN_RESOLUTION_S; rows of sessions that no longer exist
    are pruned when listed."""

    session_key = models.CharField(max_length=40, primary_key=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    user_agent = models.CharField(max_length=300, blank=True)
    ip = models.GenericIPAddressField(null=True, blank=True)
    created_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()

    class Meta:
        indexes = [
            # The account page and "sign out everywhere": one user's sessions.
            models.Index(fields=["user", "last_seen_at"], name="user_session_user_idx")
        ]

    def __str__(self) -> str:
        return f"{self.user_id} {self.session_key[:6]}…"
