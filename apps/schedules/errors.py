"""Domain errors of the schedule lifecycle. Services raise them; `tickweb.exceptions` renders
them in the one API error shape, so services never import DRF."""

from __future__ import annotations

from apps.tenants.errors import IdempotencyConflict, RefusedRequest

__all__ = [
    "IdempotencyConflict",
    "LifecycleError",
    "QuotaExceeded",
    "RuleTooFrequent",
    "StateConflict",
]


class LifecycleError(RefusedRequest):
    """A refused schedule change that changed nothing."""


class StateConflict(LifecycleError, status=409, code="state_conflict"):
    """The schedule's state does not allow the transition (e.g. pausing a canceled one)."""


class QuotaExceeded(LifecycleError, status=409, code="quota_exceeded"):
    """A count quota (active schedules) is full. Not a rate: retrying will not help until
    the tenant frees capacity, so it is a 409, never a 429 without Retry-After."""


class RuleTooFrequent(LifecycleError, status=400, code="rule_too_frequent"):
    """The rule fires more often than the tenant's minimum interval allows."""
