"""Keep a running attempt's lease: step 2 of the execution path (run.py starts it).

Lock story of the heartbeat — the handler runs outside any transaction; a thread renews the
lease every lease/3 with one conditional UPDATE of the attempt row (same token, unfinished):
- it holds that row lock only for the statement, so it serializes with the reaper
  (reaper.py) closing the attempt: after the reaper commits, the beat matches no row and
  reports the lease lost;
- the reaper locks attempts with SKIP LOCKED, so a beat in flight only defers reaping by one
  pass, and a renewed lease is no longer expired at the next one;
- the same statement reads whether the occurrence or its schedule was canceled; either, or a
  lost lease (the work is no longer this worker's), sets `ctx.cancel_requested`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from django.conf import settings
from django.db import connection

from apps.occurrences.execution.claim import Claim
from apps.occurrences.pipeline.outages import drop_database_connection, outage_of
from apps.schedules.models import Schedule

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Beat:
    lease_held: bool
    cancel_requested: bool


def attempt_heartbeat(*, claim: Claim) -> Beat:
    """Extend the attempt's lease and report whether cancellation was requested."""
    assert claim.context is not None
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE occurrences_attempt a
            SET lease_expires_at = now() + make_interval(secs => %s)
            WHERE a.id = %s AND a.scheduled_for = %s AND a.lease_token = %s
              AND a.finished_at IS NULL
            RETURNING (
                SELECT o.cancel_requested_at IS NOT NULL OR s.state = %s
                FROM occurrences_occurrence o JOIN schedules_schedule s ON s.id = o.schedule_id
                WHERE o.id = a.occurrence_id AND o.scheduled_for = a.scheduled_for
            )
            """,
            [settings.TICK_ATTEMPT_LEASE_S, claim.attempt_id, claim.context.scheduled_for,
             claim.lease_token, Schedule.State.CANCELED],
        )  # fmt: skip
        row = cursor.fetchone()
    if row is None:
        return Beat(lease_held=False, cancel_requested=False)
    return Beat(lease_held=True, cancel_requested=bool(row[0]))


class LeaseHeartbeat(threading.Thread):
    """Renews a running attempt's lease every lease/3 until `stopped` is set."""

    def __init__(self, claim: Claim) -> None:
        super().__init__(name="tick-heartbeat", daemon=True)
        self.claim = claim
        self.stopped = threading.Event()

    def run(self) -> None:
        assert self.claim.context is not None
        cancel = self.claim.context.cancel_requested
        interval = settings.TICK_ATTEMPT_LEASE_S / 3
        try:
            while not self.stopped.wait(interval):
                try:
                    beat = attempt_heartbeat(claim=self.claim)
                except Exception as exc:
                    if outage_of(exc) is None:
                        raise
                    # The handler goes on; the next beat renews the lease if the database
                    # is back before it expires, else the lease is found lost (below).
                    log.warning("heartbeat of %s failed: %r", self.claim.attempt_id, exc)
                    drop_database_connection()
                    continue
                if not beat.lease_held:
                    log.warning("lease of %s lost while running", self.claim.attempt_id)
                    cancel.set()
                    return
                if beat.cancel_requested and not cancel.is_set():
                    log.info("cancel requested for %s", self.claim.context.occurrence_id)
                    cancel.set()
        finally:
            connection.close()  # this thread's own connection
