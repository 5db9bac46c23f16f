"""The handler contract: what a handler receives, what it may raise, and how errors count.

Handlers are deployed with Tick and listed by name in registry.py; tenants choose one by name.
A handler receives a `HandlerContext` and must be idempotent on `occurrence_id`: delivery is
at least once, so the same occurrence can run again after a crash.

Errors are classified by `classify_error`: `PermanentError` and validation errors send the
occurrence DEAD; `TransientError`, connection errors, timeouts and anything unexpected are
retried (bounded by max attempts, the occurrence deadline and the tenant retry budget).
A handler that sees `ctx.cancel_requested` set should stop and raise `Canceled`.
A payload that does not suit the handler raises `PayloadError` (the registry's validators raise
it at schedule create/update; at run time it is permanent like any `PermanentError`).
Production built-ins: `noop` (below) and `webhook` (webhook.py); the demo/test handler
`record` lives in demo_handlers.py and exists only where `TICK_EXTRA_HANDLERS` names it.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError


class PermanentError(Exception):
    """Raised by a handler when retrying cannot help (bad payload, 4xx): the occurrence goes
    DEAD at once. Any other exception is treated as transient and retried."""


class PayloadError(PermanentError):
    """The payload does not suit its handler: `field` names the offending key ("payload" for
    the payload as a whole); the API answers it as `{"payload.<field>": ["<message>"]}`
    (`{"payload": [...]}` for the whole)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class TransientError(Exception):
    """Raised by a handler for a failure worth retrying (timeout, 408/429/5xx).

    `retry_after_s`: how long the target asked to be left alone (a webhook's Retry-After);
    the completion schedules the retry no earlier, capped at the occurrence's retry deadline.
    """

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Canceled(Exception):  # noqa: N818 - reads as the outcome it reports
    """Raised by a handler that stopped because `ctx.cancel_requested` was set."""


class ErrorClass(StrEnum):
    PERMANENT = "permanent"
    TRANSIENT = "transient"


def classify_error(error: BaseException) -> ErrorClass:
    """Permanent: explicit PermanentError or validation; everything else is transient."""
    if isinstance(error, PermanentError | DjangoValidationError | json.JSONDecodeError):
        return ErrorClass.PERMANENT
    return ErrorClass.TRANSIENT


class RunOrigin(StrEnum):
    """Why this run happens, as a handler and a webhook receiver see it: the occurrence's
    origin (`Occurrence.Origin`), or `replay` once it was replayed from the DLQ."""

    SCHEDULED = "scheduled"
    MANUAL = "manual"
    BACKFILL = "backfill"
    REPLAY = "replay"


def rfc3339_utc(instant: datetime) -> str:
    """`instant` in RFC 3339 UTC with a `Z` (fractional seconds only when it has them)."""
    return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclass
class HandlerContext:
    occurrence_id: uuid.UUID
    schedule_id: uuid.UUID
    schedule_version: int
    tenant_id: uuid.UUID
    scheduled_for: datetime
    attempt_no: int
    payload: Any
    # Set when the occurrence is canceled while running, or when the attempt reaches its
    # run-time limit; long handlers should poll it.
    cancel_requested: threading.Event = field(default_factory=threading.Event)
    # The attempt's run-time limit in seconds (deadlines.py); None only outside a claim.
    timeout_s: int | None = None
    origin: RunOrigin = RunOrigin.SCHEDULED

    def run_context(self) -> dict[str, Any]:
        """The run's context as the webhook handler sends it (headers, envelope) and any
        handler may report it: docs/webhooks.md "Run context"."""
        return {
            "occurrence_id": str(self.occurrence_id),
            "scheduled_for": rfc3339_utc(self.scheduled_for),
            "attempt": self.attempt_no,
            "schedule_id": str(self.schedule_id),
            "schedule_version": self.schedule_version,
            "origin": str(self.origin),
        }


Handler = Callable[[HandlerContext], None]


def noop_handler(ctx: HandlerContext) -> None:
    """Does nothing: for demos and for measuring the delivery path itself."""
