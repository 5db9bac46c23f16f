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
Built-ins: `noop`, `record` (demo/test, below) and `webhook` (webhook.py).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import connection
from django.utils import timezone


class PermanentError(Exception):
    """Raised by a handler when retrying cannot help (bad payload, 4xx): the occurrence goes
    DEAD at once. Any other exception is treated as transient and retried."""


class PayloadError(PermanentError):
    """The payload does not suit its handler: `field` names the offending key ("payload" for
    the payload as a whole); the API answers it as `{"payload": ["<field>: <message>"]}`."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class TransientError(Exception):
    """Raised by a handler for a failure worth retrying (timeout, 408/429/5xx)."""


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


@dataclass
class HandlerContext:
    occurrence_id: uuid.UUID
    schedule_id: uuid.UUID
    schedule_version: int
    tenant_id: uuid.UUID
    scheduled_for: datetime
    attempt_no: int
    payload: Any
    # Set when the occurrence is canceled while running; long handlers should poll it.
    cancel_requested: threading.Event = field(default_factory=threading.Event)


Handler = Callable[[HandlerContext], None]


def noop_handler(ctx: HandlerContext) -> None:
    """Does nothing: for demos and for measuring the delivery path itself."""


def record_handler(ctx: HandlerContext) -> None:
    """Demo/test handler: records its effect once per occurrence id.

    A redelivery of the same occurrence leaves the effect as it was and only counts the
    extra delivery, which is what "idempotent on occurrence_id" means for a real handler.

    Test knobs in the payload (all optional):
    `sleep_s` + `sleep_attempts` (default 1): after recording, attempts up to that number
    sleep, waking early and raising `Canceled` when cancellation is requested;
    `fail`: "permanent" | "transient" + `fail_attempts` (default all): raise after recording.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO occurrences_handlereffect
                (occurrence_id, tenant_id, schedule_id, scheduled_for, attempt_no, payload,
                 first_run_at, deliveries)
            VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s, 1)
            ON CONFLICT (occurrence_id)
            DO UPDATE SET deliveries = occurrences_handlereffect.deliveries + 1
            """,
            [
                ctx.occurrence_id,
                ctx.tenant_id,
                ctx.schedule_id,
                ctx.scheduled_for,
                ctx.attempt_no,
                json.dumps(ctx.payload),
                timezone.now(),
            ],
        )
    knobs = ctx.payload if isinstance(ctx.payload, dict) else {}
    sleep_s = float(knobs.get("sleep_s", 0))
    if sleep_s > 0 and ctx.attempt_no <= int(knobs.get("sleep_attempts", 1)):
        if ctx.cancel_requested.wait(sleep_s):
            raise Canceled("record handler stopped: cancellation requested")
    fail = knobs.get("fail")
    if fail and ctx.attempt_no <= int(knobs.get("fail_attempts", 1_000_000)):
        if fail == "permanent":
            raise PermanentError("payload asked the record handler to fail permanently")
        raise TransientError("payload asked the record handler to fail transiently")
