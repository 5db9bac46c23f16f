"""Refusals raised by domain services. `tickweb.exceptions` renders them in the one API error
shape, so services never import DRF. Every app's refusals derive from `RefusedRequest`."""

from __future__ import annotations


class RefusedRequest(Exception):
    """A refused request that changed nothing. `status`/`code` are the API rendering."""

    status = 400
    code = "invalid"

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


class IdempotencyConflict(RefusedRequest):
    """The Idempotency-Key was first used with another request body."""

    status = 409
    code = "idempotency_key_reused"


class RotationInProgress(RefusedRequest):
    """Two signing secrets are already active: a third rotation would drop the previous one
    while receivers may still verify with it (docs/webhooks.md)."""

    status = 409
    code = "rotation_in_progress"


class LastSigningSecret(RefusedRequest):
    """Revoking the only active signing secret would leave webhooks with nothing the
    receiver knows to sign with: rotate first."""

    status = 409
    code = "last_signing_secret"


class SigningUnavailable(Exception):
    """A stored signing secret cannot be decrypted with the configured keys (TICK_SIGNING_KEYS
    lost or changed): an operator's configuration error, not a tenant's."""


class MembershipConflict(RefusedRequest):
    """The address is already a member, or already has an open invitation (re-send it)."""

    status = 409
    code = "membership_conflict"


class LastAdminRefused(RefusedRequest):
    """Removing or demoting the tenant's last admin would leave nobody to run the account."""

    status = 409
    code = "last_admin"


class InvitationStateConflict(RefusedRequest):
    """The invitation was already accepted or revoked: it cannot be re-sent or revoked."""

    status = 409
    code = "invitation_closed"


class MailRateLimited(RefusedRequest):
    """The tenant sent its hour's share of a kind of mail (invitations, test alerts, channel
    confirmations): nothing was sent; `retry_after_s` says when one is free again."""

    status = 429
    code = "rate_limited"
