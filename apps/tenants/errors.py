"""Refusals raised by domain services. `tickweb.exceptions` renders them in the one API error
shape, so services never import DRF. Every app's refusals derive from `RefusedRequest`."""

from __future__ import annotations

from typing import Any


class RefusedRequest(Exception):
    """A refused request that changed nothing. `status`/`code` are the API rendering; a
    subclass declares its own in its header: `class X(RefusedRequest, status=409, code=…)`."""

    status = 400
    code = "invalid"

    def __init_subclass__(
        cls, *, status: int | None = None, code: str | None = None, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
        if code is not None:
            cls.code = code

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.retry_after_s = retry_after_s


class IdempotencyConflict(RefusedRequest, status=409, code="idempotency_key_reused"):
    """The Idempotency-Key was first used with another request body."""


class RotationInProgress(RefusedRequest, status=409, code="rotation_in_progress"):
    """Two signing secrets are already active: a third rotation would drop the previous one
    while receivers may still verify with it (docs/webhooks.md)."""


class LastSigningSecret(RefusedRequest, status=409, code="last_signing_secret"):
    """Revoking the only active signing secret would leave webhooks with nothing the
    receiver knows to sign with: rotate first."""


class SigningUnavailable(Exception):
    """A stored signing secret cannot be decrypted with the configured keys (TICK_SIGNING_KEYS
    lost or changed): an operator's configuration error, not a tenant's."""


class MembershipConflict(RefusedRequest, status=409, code="membership_conflict"):
    """The address is already a member, or already has an open invitation (re-send it)."""


class LastAdminRefused(RefusedRequest, status=409, code="last_admin"):
    """Removing or demoting the tenant's last admin would leave nobody to run the account."""


class InvitationStateConflict(RefusedRequest, status=409, code="invitation_closed"):
    """The invitation was already accepted or revoked: it cannot be re-sent or revoked."""


class MailRateLimited(RefusedRequest, status=429, code="rate_limited"):
    """The tenant sent its hour's share of a kind of mail (invitations, test alerts, channel
    confirmations): nothing was sent; `retry_after_s` says when one is free again."""
