"""Demo and test handlers: offered only where `TICK_EXTRA_HANDLERS` names them.

`record` obeys knobs in the tenant's payload (sleep, fail), so in a shared deployment any tenant
could make a worker slot sleep or fail at will. The default of the setting (tickweb/settings.py)
is empty in production and `record` under DJANGO_DEBUG=1, which `make run` (its demo schedule)
and `make test` use; registry.py adds the entries named there to the production built-ins at
each lookup, and tickweb/checks.py refuses a name that is not listed here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping

from django.db import connection
from django.utils import timezone

from apps.occurrences.execution.handlers import (
    Canceled,
    HandlerContext,
    PermanentError,
    TransientError,
)
from apps.occurrences.execution.registry import HandlerSpec, any_json_payload


def record_handler(ctx: HandlerContext) -> None:
    """Records its effect once per occurrence id.

    A redelivery of the same occurrence leaves the effect as it was and only counts the
    extra delivery, which is what "idempotent on occurrence_id" means for a real handler.

    Test knobs in the payload (all optional):
    `sleep_s` + `sleep_attempts` (default 1): after recording, attempts up to that number
    sleep, waking early and raising `Canceled` when cancellation is requested (or its
    deadline passes), unless `ignore_cancel` is true: then they sleep it out (a hard-stuck
    handler, reclaimed only by the deadline's hard stop, deadlines.py);
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
        if knobs.get("ignore_cancel") is True:
            time.sleep(sleep_s)
        elif ctx.cancel_requested.wait(sleep_s):
            raise Canceled("record handler stopped: cancellation requested")
    fail = knobs.get("fail")
    if fail and ctx.attempt_no <= int(knobs.get("fail_attempts", 1_000_000)):
        if fail == "permanent":
            raise PermanentError("payload asked the record handler to fail permanently")
        raise TransientError("payload asked the record handler to fail transiently")


DEMO_HANDLERS: Mapping[str, HandlerSpec] = {
    "record": HandlerSpec(
        run=record_handler, validate_payload=any_json_payload, default_timeout_s=60
    ),
}
