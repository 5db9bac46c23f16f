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
The same thread keeps the attempt's run-time limit (deadlines.py): the cancel event at the
limit, no renewal past limit + grace, and then the hard stop run.py hands it.
The threads are kept: one that finished its attempt waits, idle, for the process's next one
(a pool process runs one attempt at a time, so it keeps one thread). Starting a thread per
attempt cost about as much CPU as a noop handler's whole task in bare Celery.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db import connection

from apps.occurrences.execution.claim import Claim
from apps.occurrences.models import attempt_open_by_key
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
            f"""
            UPDATE occurrences_attempt a
            SET lease_expires_at = now() + make_interval(secs => %s)
            WHERE a.id = %s AND a.scheduled_for = %s AND a.lease_token = %s
              AND {attempt_open_by_key("a")}
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


class _Keeper(threading.Thread):
    """A kept heartbeat thread: runs one LeaseHeartbeat at a time, then waits idle."""

    _idle: list[_Keeper] = []
    _idle_lock = threading.Lock()

    def __init__(self) -> None:
        super().__init__(name="tick-heartbeat", daemon=True)
        self._jobs: queue.SimpleQueue[LeaseHeartbeat] = queue.SimpleQueue()

    @classmethod
    def run_job(cls, job: LeaseHeartbeat) -> None:
        with cls._idle_lock:
            keeper = cls._idle.pop() if cls._idle else None
            # A thread listed before a fork does not exist in the child.
            while keeper is not None and not keeper.is_alive():
                keeper = cls._idle.pop() if cls._idle else None
        if keeper is None:
            keeper = cls()
            keeper.start()
        keeper._jobs.put(job)

    def run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job.run()
            except Exception:  # noqa: BLE001 - as an uncaught error ends a thread: logged
                log.exception("heartbeat of %s failed", job.claim.attempt_id)
            finally:
                with self._idle_lock:
                    self._idle.append(self)
                job.done.set()


class LeaseHeartbeat:
    """Renews a running attempt's lease every lease/3 until `stopped` is set, and keeps the
    attempt's run-time limit (`ctx.timeout_s`, deadlines.py): at the limit it sets the cancel
    event and `deadline_passed`; at limit + grace it stops renewing and, if the handler has
    not returned, calls `on_hard_limit`. `start` hands it to a kept thread (module
    docstring), `join` waits until that thread is done with it."""

    def __init__(self, claim: Claim, *, on_hard_limit: Callable[[], None]) -> None:
        assert claim.context is not None
        self.claim = claim
        self.on_hard_limit = on_hard_limit
        self.stopped = threading.Event()
        self.deadline_passed = threading.Event()
        self.done = threading.Event()
        timeout_s = claim.context.timeout_s
        # Monotonic instants, counted from now: the handler starts right after construction.
        self._limit = math.inf if timeout_s is None else time.monotonic() + timeout_s
        self._hard_limit = self._limit + settings.TICK_HANDLER_TIMEOUT_GRACE_S

    def start(self) -> None:
        _Keeper.run_job(self)

    def join(self, timeout: float | None = None) -> None:
        self.done.wait(timeout)

    def run(self) -> None:
        try:
            self._keep()
        finally:
            connection.close()  # the kept thread's own connection, if a beat opened one

    def _keep(self) -> None:
        interval = settings.TICK_ATTEMPT_LEASE_S / 3
        next_beat = time.monotonic() + interval
        while True:
            next_limit = self._hard_limit if self.deadline_passed.is_set() else self._limit
            if self.stopped.wait(max(0.0, min(next_beat, next_limit) - time.monotonic())):
                return
            now = time.monotonic()
            if now >= self._limit and not self.deadline_passed.is_set():
                self._soft_stop()
            if now >= self._hard_limit:  # no renewal past the grace
                if not self.stopped.is_set():
                    self.on_hard_limit()
                return
            if now >= next_beat:
                # A lost lease ends the beats, not the clock: a handler that ignores the cancel
                # still loses its slot at limit + grace.
                next_beat = now + interval if self._beat() else math.inf
                if next_beat == math.inf and self._limit == math.inf:
                    return

    def _soft_stop(self) -> None:
        assert self.claim.context is not None
        ctx = self.claim.context
        log.warning("occurrence %s attempt %s reached its %s s limit: asked to stop",
                    ctx.occurrence_id, ctx.attempt_no, ctx.timeout_s)  # fmt: skip
        self.deadline_passed.set()
        ctx.cancel_requested.set()

    def _beat(self) -> bool:
        """Renew the lease once; False when it is lost (the work is no longer ours)."""
        assert self.claim.context is not None
        cancel = self.claim.context.cancel_requested
        try:
            beat = attempt_heartbeat(claim=self.claim)
        except Exception as exc:
            if outage_of(exc) is None:
                raise
            # The handler goes on; the next beat renews the lease if the database is back
            # before it expires, else the lease is found lost.
            log.warning("heartbeat of %s failed: %r", self.claim.attempt_id, exc)
            drop_database_connection()
            return True
        if not beat.lease_held:
            log.warning("lease of %s lost while running", self.claim.attempt_id)
            cancel.set()
            return False
        if beat.cancel_requested and not cancel.is_set():
            log.info("cancel requested for %s", self.claim.context.occurrence_id)
            cancel.set()
        return True
