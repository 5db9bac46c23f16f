"""Group commit of successful completions in a worker's pool process (run.py hands them here).

One transaction per completion was most of the execution path's PostgreSQL work
(docs/performance.md "Execution path under sustained load"): a pool process runs one task at
a time, so a short handler's completion is its own BEGIN, lease check, two updates and
COMMIT. Here a SUCCEEDED completion of a schedule whose overlap policy is ALLOW is queued in
the process, and a flusher thread writes every queued one in one transaction every
`TICK_COMPLETION_GROUP_MS` (at once when `TICK_COMPLETION_GROUP_MAX` are queued), with the
same per-row fencing as complete.py. Off by default (0): a single completion is now one
statement, and a held success counts against its tenant's share until it is written
(docs/decisions.md "Claim and completion in fewer round trips").

a. lock the batch's attempts that still hold their lease (same token, unfinished), in id
   order — a member the reaper or a newer attempt took over is left alone (stale, counted);
b. set the occurrences of those attempts SUCCEEDED where they are still RUNNING with the
   same attempt_count (a miss is stale as in complete.py, c; a row another transaction
   holds is passed by and written at the next flush);
c. close exactly those attempts (a-c are one statement, `_SUCCEED_AND_CLOSE`).
Locks: attempts before occurrences, as in complete.py. A failure (an outage, a deadlock)
rolls the whole batch back; its members stay queued for the next flush.

What it changes and what it does not (docs/decisions.md "Group commit of completions"):
- the acknowledgement rule is unchanged: a message is acknowledged once its claim committed
  (tasks.py); the attempt and its lease remain the durable record of the run. A queued
  completion lost with its process (a crash, a kill) is a lease that expires: the reaper
  re-queues the occurrence and it runs again under the same id — exactly what happens today
  to a completion that cannot be written (run.py);
- only successes of ALLOW schedules are grouped: failures (retry decisions, DEAD alerts,
  budgets), cancels and the QUEUE_ONE / SKIP_IF_RUNNING policies, whose next claim looks
  for a RUNNING one, complete at once as before;
- a grouped occurrence shows RUNNING (and counts in its tenant's running attempts, so in
  quotas and the fair share) for at most the flush interval after its handler returned.
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from celery import signals
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.occurrences.execution.claim import Claim
from apps.occurrences.execution.statements import (
    ATTEMPT_ROW_TABLE,
    OCCURRENCE_ROW_TABLE,
    execute_prepared,
    on_partitioned_tables,
    on_row_partitions,
)
from apps.occurrences.models import Attempt, Occurrence, attempt_open_by_key
from apps.occurrences.observability import metrics
from apps.occurrences.pipeline.outages import drop_database_connection, outage_of
from apps.schedules.models import Schedule

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Completion:
    """One successful attempt waiting for the group commit."""

    attempt_id: uuid.UUID
    scheduled_for: datetime
    lease_token: uuid.UUID
    occurrence_id: uuid.UUID
    attempt_no: int
    finished_at: datetime

    @classmethod
    def of(cls, claim: Claim, finished_at: datetime) -> Completion:
        ctx = claim.context
        assert ctx is not None and claim.attempt_id is not None and claim.lease_token
        return cls(claim.attempt_id, ctx.scheduled_for, claim.lease_token, ctx.occurrence_id,
                   ctx.attempt_no, finished_at)  # fmt: skip


def groupable(claim: Claim, error: BaseException | None) -> bool:
    """Whether this completion may wait for the group commit (module docstring)."""
    return settings.TICK_COMPLETION_GROUP_MS > 0 and batchable(claim, error)


def batchable(claim: Claim, error: BaseException | None) -> bool:
    """Whether this completion may be written with others (`completions_record`): a success
    of an ALLOW schedule, which nothing reads back in the same transaction."""
    return (
        error is None
        and claim.overlap_policy == Schedule.OverlapPolicy.ALLOW
        # A success that ends a DEAD streak resets it (complete.py), one by one.
        and claim.dead_streak == 0
        and claim.context is not None
        and not claim.context.cancel_requested.is_set()
    )


def _arrays(batch: list[Completion]) -> dict[str, Any]:
    return {
        "ids": [c.attempt_id for c in batch],
        "at": [c.scheduled_for for c in batch],
        "tokens": [c.lease_token for c in batch],
        "occurrences": [c.occurrence_id for c in batch],
        "nos": [c.attempt_no for c in batch],
        "finished": [c.finished_at for c in batch],
    }


# Steps a-c in one statement: the batch's attempts that still hold their lease are locked
# first, in id order (attempts before occurrences, as complete.py: `held` is read whole before
# `free` starts); the occurrences still RUNNING with the same attempt_count move to SUCCEEDED,
# and exactly their attempts close. The occurrence rows are taken SKIP LOCKED: the relay's
# record statement locks a batch of rows in its own order, RUNNING ones too, so waiting for
# several here could deadlock with it (docs/decisions.md "Envelope runs"); a member passed by
# is returned as such and the caller completes it on its own.
_SUCCEED_AND_CLOSE = f"""
    WITH c AS (
        SELECT * FROM unnest(%(occurrences)s::uuid[], %(at)s::timestamptz[], %(nos)s::int[],
                             %(finished)s::timestamptz[], %(ids)s::uuid[], %(tokens)s::uuid[])
            AS c(occurrence_id, scheduled_for, attempt_no, finished_at, attempt_id, lease_token)
    ), held AS MATERIALIZED (
        SELECT a.id FROM {ATTEMPT_ROW_TABLE} a
          JOIN c ON a.id = c.attempt_id AND a.scheduled_for = c.scheduled_for
                AND a.lease_token = c.lease_token
         WHERE {attempt_open_by_key("a")}
      ORDER BY a.id
           FOR UPDATE OF a
    ), free AS (
        SELECT o.id, o.scheduled_for FROM {OCCURRENCE_ROW_TABLE} o
          JOIN c ON o.id = c.occurrence_id AND o.scheduled_for = c.scheduled_for
          JOIN held h ON h.id = c.attempt_id
         WHERE (SELECT count(*) FROM held) >= 0
           AND o.state = %(running)s AND o.attempt_count = c.attempt_no
           FOR UPDATE OF o SKIP LOCKED
    ), succeeded AS (
        UPDATE {OCCURRENCE_ROW_TABLE} o SET state = %(succeeded)s, finished_at = c.finished_at
          FROM c JOIN free f ON f.id = c.occurrence_id AND f.scheduled_for = c.scheduled_for
         WHERE o.id = c.occurrence_id AND o.scheduled_for = c.scheduled_for
     RETURNING c.attempt_id
    ), closed AS (
        UPDATE {ATTEMPT_ROW_TABLE} a
           SET finished_at = c.finished_at, outcome = %(outcome)s, error_class = '',
               error_message = ''
          FROM c JOIN succeeded s ON s.attempt_id = c.attempt_id
         WHERE a.id = c.attempt_id AND a.scheduled_for = c.scheduled_for
           AND a.lease_token = c.lease_token AND {attempt_open_by_key("a")}
    )
    SELECT attempt_id, true FROM succeeded
    UNION ALL
    SELECT c.attempt_id, false FROM c JOIN held h ON h.id = c.attempt_id
     WHERE NOT EXISTS (SELECT 1 FROM free f
                        WHERE f.id = c.occurrence_id AND f.scheduled_for = c.scheduled_for)
       AND EXISTS (SELECT 1 FROM {OCCURRENCE_ROW_TABLE} o
                    WHERE o.id = c.occurrence_id AND o.scheduled_for = c.scheduled_for
                      AND o.state = %(running)s AND o.attempt_count = c.attempt_no)
"""


@dataclass(frozen=True)
class Recorded:
    """What a group commit wrote: `succeeded` attempts, and `passed_by` ones still current
    whose occurrence row another transaction held (`_SUCCEED_AND_CLOSE`); the rest of the
    batch was stale."""

    succeeded: set[uuid.UUID]
    passed_by: set[uuid.UUID]


def completions_record(batch: list[Completion]) -> Recorded:
    """Write a batch of successful completions in one transaction (module docstring, a-c).
    A batch of one day names that day's partitions (statements.py)."""
    if not batch:
        return Recorded(set(), set())
    now = timezone.now()
    days = {c.scheduled_for.astimezone(UTC).date() for c in batch}
    name = (
        (lambda sql: on_row_partitions(sql, batch[0].scheduled_for, now))
        if len(days) == 1
        else on_partitioned_tables
    )
    with transaction.atomic(), connection.cursor() as cursor:
        found = execute_prepared(cursor, name(_SUCCEED_AND_CLOSE), {
            **_arrays(batch), "succeeded": Occurrence.State.SUCCEEDED,
            "running": Occurrence.State.RUNNING, "outcome": Attempt.Outcome.SUCCEEDED,
        }).fetchall()  # fmt: skip
    return Recorded({a for a, done in found if done}, {a for a, done in found if not done})


class CompletionGroup:
    """The queue of this process's successful completions and its flusher thread."""

    def __init__(self, *, flusher: bool = True) -> None:
        self._flusher = flusher  # False: only `flush` writes (tests)
        self._pending: list[Completion] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, completion: Completion) -> None:
        with self._lock:
            self._pending.append(completion)
            full = len(self._pending) >= settings.TICK_COMPLETION_GROUP_MAX
            if self._flusher and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(
                    target=self._run, name="tick-completion-group", daemon=True
                )
                self._thread.start()
        if full:
            self._wake.set()

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def _run(self) -> None:
        while True:
            self._wake.wait(settings.TICK_COMPLETION_GROUP_MS / 1000)
            self._wake.clear()
            self.flush()

    def flush(self) -> int:
        """Write what is queued now; on a failure the batch stays queued. Returns the number
        of completions written or found stale."""
        with self._lock:
            batch, self._pending = self._pending, []
        if not batch:
            return 0
        try:
            recorded = completions_record(batch)
        except Exception as exc:  # noqa: BLE001 - retried at the next flush; the lease bounds it
            if outage_of(exc) is not None:
                drop_database_connection()
            log.warning("group commit of %d completions failed (%r); retried", len(batch), exc)
            with self._lock:
                self._pending = batch + self._pending
            return 0
        if recorded.passed_by:
            # Their rows were busy (the relay recording them): written at the next flush.
            with self._lock:
                self._pending = [
                    c for c in batch if c.attempt_id in recorded.passed_by
                ] + self._pending
        stale = len(batch) - len(recorded.succeeded) - len(recorded.passed_by)
        if stale:
            metrics.stale_completions.inc(stale)
        if recorded.succeeded:
            metrics.attempts_finished.labels(outcome=Attempt.Outcome.SUCCEEDED).inc(
                len(recorded.succeeded)
            )
        return len(batch) - len(recorded.passed_by)


group = CompletionGroup()


@signals.worker_process_shutdown.connect
def _flush_at_shutdown(**_: Any) -> None:
    # A pool process that ends normally writes what it queued; one killed leaves it to the
    # reaper (module docstring).
    group.flush()
