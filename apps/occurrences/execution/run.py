"""Run one occurrence end to end: claim, run its handler, complete (tasks.py calls this).

Lock story of a run: no lock and no transaction is held while the handler runs.
1. The claim (claim.py) commits an attempt with a lease; it is the only durable trace of
   the run from then on.
2. The handler runs outside any transaction while a heartbeat thread (heartbeat.py) renews
   the lease and raises `ctx.cancel_requested` on cancel or a lost lease.
3. The completion (complete.py) writes the result only if the attempt still holds its lease.
If the worker dies in between, the reaper (reaper.py) takes the attempt back when its lease
expires, and the occurrence runs again under the same id.

Database outages (docs/decisions.md, "Worker acknowledgements"):
- before the claim commits nothing is durable, so the claim is retried with backoff for up
  to `TICK_WORKER_OUTAGE_RETRY_S`; past that the outage error propagates and the task hands
  its message back to the broker (never acknowledged undone);
- once the claim committed, the open attempt and its lease are the durable record: a
  completion that cannot be written is retried the same way, and if it still fails the
  reaper re-queues the occurrence when the lease expires (a same-id re-run).
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any

from django.conf import settings

from apps.occurrences.execution.claim import Claim, ClaimStatus, occurrence_claim
from apps.occurrences.execution.complete import attempt_complete
from apps.occurrences.execution.handlers import PermanentError
from apps.occurrences.execution.heartbeat import LeaseHeartbeat
from apps.occurrences.execution.registry import handler_spec
from apps.occurrences.observability import logs
from apps.occurrences.pipeline.outages import call_through_outages, outage_of

log = logging.getLogger(__name__)


def occurrence_execute(
    *, occurrence_id: uuid.UUID, scheduled_for: datetime, worker_id: str
) -> dict[str, Any]:
    """Claim, run the schedule's handler, complete. Returns a summary for logs and tests."""
    claim = call_through_outages(
        lambda: occurrence_claim(
            occurrence_id=occurrence_id, scheduled_for=scheduled_for, worker_id=worker_id
        ),
        who=f"claim {occurrence_id}",
        role="worker",
        give_up_after_s=settings.TICK_WORKER_OUTAGE_RETRY_S,
    )
    if claim.status != ClaimStatus.CLAIMED or claim.context is None:
        log.info("occurrence %s not run: %s", occurrence_id, claim.status.value,
                 extra=logs.ids(occurrence_id=occurrence_id))  # fmt: skip
        return {"status": claim.status.value}
    error = _run_handler(claim)
    return _complete(claim, error)


def _run_handler(claim: Claim) -> BaseException | None:
    """Step 2: run the schedule's handler under the lease heartbeat; returns its error."""
    ctx = claim.context
    assert ctx is not None
    spec = handler_spec(claim.handler)
    if spec is None:
        return PermanentError(f"no handler registered as {claim.handler!r}")
    heartbeat = LeaseHeartbeat(claim)
    heartbeat.start()
    try:
        spec.run(ctx)
    except Exception as exc:  # noqa: BLE001 - every handler failure is classified at completion
        log.warning("occurrence %s attempt %s failed: %r", ctx.occurrence_id, ctx.attempt_no,
                    exc, extra=logs.ids(tenant_id=ctx.tenant_id, schedule_id=ctx.schedule_id,
                                        occurrence_id=ctx.occurrence_id))  # fmt: skip
        return exc
    finally:
        heartbeat.stopped.set()
        heartbeat.join()
    return None


def _complete(claim: Claim, error: BaseException | None) -> dict[str, Any]:
    """Step 3, retried through a database outage; an unrecordable result is left to the
    reaper (module docstring)."""
    ctx = claim.context
    assert ctx is not None
    try:
        state = call_through_outages(
            lambda: attempt_complete(claim=claim, error=error),
            who=f"completion of {ctx.occurrence_id}",
            role="worker",
            give_up_after_s=settings.TICK_WORKER_OUTAGE_RETRY_S,
        )
    except Exception as exc:
        if outage_of(exc) is None:
            raise
        log.error("occurrence %s attempt %s: completion not recorded (%r); the reaper "
                  "re-queues it when its lease expires", ctx.occurrence_id, ctx.attempt_no,
                  exc)  # fmt: skip
        return {"status": "unrecorded", "attempt_no": ctx.attempt_no}
    status = "stale" if state is None else str(state)
    log.info("occurrence %s attempt %s: %s", ctx.occurrence_id, ctx.attempt_no, status,
             extra=logs.ids(tenant_id=ctx.tenant_id, schedule_id=ctx.schedule_id,
                            occurrence_id=ctx.occurrence_id))  # fmt: skip
    return {"status": status, "attempt_no": ctx.attempt_no}
