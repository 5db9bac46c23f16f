"""Run one occurrence end to end: claim, run its handler, complete (tasks.py calls this).

Lock story of a run: no lock and no transaction is held while the handler runs.
1. The claim (claim.py) commits an attempt with a lease; it is the only durable trace of
   the run from then on.
2. The handler runs outside any transaction while a heartbeat thread (heartbeat.py) renews
   the lease and raises `ctx.cancel_requested` on cancel, a lost lease or the attempt's
   run-time limit; past limit + grace it reclaims the slot (`_reclaim`, deadlines.py).
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
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from django.conf import settings
from django.utils import timezone

from apps.occurrences.execution import complete_batch
from apps.occurrences.execution.claim import Claim, ClaimStatus, occurrence_claim
from apps.occurrences.execution.complete import attempt_complete
from apps.occurrences.execution.complete_batch import Completion, groupable
from apps.occurrences.execution.deadlines import (
    DeadlineExceeded,
    end_pool_process,
    in_pool_process,
)
from apps.occurrences.execution.handlers import PermanentError
from apps.occurrences.execution.heartbeat import LeaseHeartbeat
from apps.occurrences.execution.registry import handler_spec
from apps.occurrences.execution.run_times import handler_times
from apps.occurrences.models import Occurrence
from apps.occurrences.observability import logs
from apps.occurrences.pipeline.outages import call_through_outages, outage_of

log = logging.getLogger(__name__)

_T = TypeVar("_T")


def through_worker_outages(call: Callable[[], _T], *, who: str) -> _T:
    """`call`, retried through a database outage for `TICK_WORKER_OUTAGE_RETRY_S` (module
    docstring); past that the outage error propagates."""
    return call_through_outages(
        call, who=who, role="worker", give_up_after_s=settings.TICK_WORKER_OUTAGE_RETRY_S
    )


def occurrence_execute(
    *, occurrence_id: uuid.UUID, scheduled_for: datetime, worker_id: str
) -> dict[str, Any]:
    """Claim, run the schedule's handler, complete. Returns a summary for logs and tests."""
    claim = through_worker_outages(
        lambda: occurrence_claim(
            occurrence_id=occurrence_id, scheduled_for=scheduled_for, worker_id=worker_id
        ),
        who=f"claim {occurrence_id}",
    )
    if claim.status != ClaimStatus.CLAIMED or claim.context is None:
        log.info("occurrence %s not run: %s", occurrence_id, claim.status.value,
                 extra=logs.ids(occurrence_id=occurrence_id))  # fmt: skip
        return {"status": claim.status.value}
    error = handler_run(claim)
    return completion_record(claim, error)


def handler_run(claim: Claim) -> BaseException | None:
    """Step 2: run the schedule's handler under the lease heartbeat; returns its error."""
    ctx = claim.context
    assert ctx is not None
    spec = handler_spec(claim.handler)
    if spec is None:
        return PermanentError(f"no handler registered as {claim.handler!r}")
    heartbeat = LeaseHeartbeat(claim, on_hard_limit=lambda: _reclaim(claim))
    heartbeat.start()
    error: BaseException | None = None
    started = time.monotonic()
    try:
        spec.run(ctx)
    except Exception as exc:  # noqa: BLE001 - every handler failure is classified at completion
        error = exc
    finally:
        handler_times.record(claim.handler, time.monotonic() - started)
        heartbeat.stopped.set()
        heartbeat.join()
    if error is not None and heartbeat.deadline_passed.is_set():
        # It stopped because its limit came (a return would have been a success).
        error = DeadlineExceeded(f"stopped at its {ctx.timeout_s} s run-time limit ({error!r})")
    if error is not None:
        log.warning("occurrence %s attempt %s failed: %r", ctx.occurrence_id, ctx.attempt_no,
                    error, extra=log_ids(claim))  # fmt: skip
    return error


def _reclaim(claim: Claim) -> None:
    """The hard stop (deadlines.py, 3), on the heartbeat thread: the handler is still running
    past its limit + grace. Record TIMED_OUT under the lease, then end the pool process."""
    ctx = claim.context
    assert ctx is not None
    grace_s = settings.TICK_HANDLER_TIMEOUT_GRACE_S
    error = DeadlineExceeded(
        f"still running {grace_s} s after its {ctx.timeout_s} s run-time limit: reclaimed"
    )
    try:
        state = attempt_complete(claim=claim, error=error)
    except Exception as exc:  # noqa: BLE001 - the slot is reclaimed even so
        # The lease is no longer renewed: the reaper takes the attempt back when it expires.
        log.error("occurrence %s attempt %s: TIMED_OUT not recorded (%r)", ctx.occurrence_id,
                  ctx.attempt_no, exc, extra=log_ids(claim))  # fmt: skip
        state = None
    if in_pool_process():
        log.error("occurrence %s attempt %s: handler stuck past its limit (%s); replacing "
                  "this pool process", ctx.occurrence_id, ctx.attempt_no, state or "stale",
                  extra=log_ids(claim))  # fmt: skip
        end_pool_process()
    log.error("occurrence %s attempt %s: handler stuck past its limit (%s); outside a prefork "
              "pool its thread cannot be stopped and keeps this slot until it returns",
              ctx.occurrence_id, ctx.attempt_no, state or "stale",
              extra=log_ids(claim))  # fmt: skip


def log_ids(claim: Claim) -> dict[str, str]:
    """The ids a log line about this claim's run carries."""
    ctx = claim.context
    assert ctx is not None
    return logs.ids(tenant_id=ctx.tenant_id, schedule_id=ctx.schedule_id,
                    occurrence_id=ctx.occurrence_id)  # fmt: skip


def completion_record(claim: Claim, error: BaseException | None) -> dict[str, Any]:
    """Step 3, retried through a database outage; an unrecordable result is left to the
    reaper (module docstring). In a pool process a success of an ALLOW schedule is queued for
    the process's group commit instead when it is on (complete_batch.py)."""
    ctx = claim.context
    assert ctx is not None
    if in_pool_process() and groupable(claim, error):
        complete_batch.group.add(Completion.of(claim, timezone.now()))
        log.info("occurrence %s attempt %s: succeeded (group commit)", ctx.occurrence_id,
                 ctx.attempt_no, extra=log_ids(claim))  # fmt: skip
        return {
            "status": str(Occurrence.State.SUCCEEDED),
            "attempt_no": ctx.attempt_no,
            "grouped": True,
        }
    try:
        state = through_worker_outages(
            lambda: attempt_complete(claim=claim, error=error),
            who=f"completion of {ctx.occurrence_id}",
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
             extra=log_ids(claim))  # fmt: skip
    return {"status": status, "attempt_no": ctx.attempt_no}
