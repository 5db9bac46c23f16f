"""Handlers are registered by name and deployed with Tick; tenants choose one by name.

A handler receives a `HandlerContext` and must be idempotent on `occurrence_id`: delivery is
at least once, so the same occurrence can run again after a crash.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection
from django.utils import timezone


class PermanentError(Exception):
    """Raised by a handler when retrying cannot help (bad payload, 4xx): the occurrence goes
    DEAD at once. Any other exception is treated as transient and retried."""


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
_registry: dict[str, Handler] = {}


def register_handler(name: str) -> Callable[[Handler], Handler]:
    def decorator(func: Handler) -> Handler:
        if name in _registry and _registry[name] is not func:
            raise ValueError(f"handler {name!r} is already registered")
        _registry[name] = func
        return func

    return decorator


def get_handler(name: str) -> Handler | None:
    return _registry.get(name)


def handler_names() -> list[str]:
    return sorted(_registry)


@register_handler("record")
def record_handler(ctx: HandlerContext) -> None:
    """Demo/test handler: records its effect once per occurrence id.

    A redelivery of the same occurrence leaves the effect as it was and only counts the
    extra delivery, which is what "idempotent on occurrence_id" means for a real handler.
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
    if isinstance(ctx.payload, dict) and ctx.payload.get("fail") == "permanent":
        raise PermanentError("payload asked the record handler to fail permanently")
