"""Domain errors of the schedule lifecycle. Services raise them; `tickweb.exceptions` renders
them in the one API error shape, so services never import DRF."""

from __future__ import annotations


class LifecycleError(Exception):
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


class StateConflict(LifecycleError):
    """The schedule's state does not allow the transition (e.g. pausing a canceled one)."""

    status = 409
    code = "state_conflict"


class QuotaExceeded(LifecycleError):
    """A count quota (active schedules) is full. Not a rate: retrying will not help until
    the tenant frees capacity, so it is a 409, never a 429 without Retry-After."""

    status = 409
    code = "quota_exceeded"


class RuleTooFrequent(LifecycleError):
    """The rule fires more often than the tenant's minimum interval allows."""

    status = 400
    code = "rule_too_frequent"


class IdempotencyConflict(LifecycleError):
    """The Idempotency-Key was first used with another request body."""

    status = 409
    code = "idempotency_key_reused"
