"""Envelope runs: a short handler's envelope claimed, run and completed together in one slot.

Why (docs/decisions.md "Envelope runs"): a claim and a completion of their own cost about a
millisecond of PostgreSQL CPU per occurrence, most of it per transaction, not per row; a
statement over ten rows of the day partition costs about a fifth of that per row. An
envelope (pipeline/relay.py) already brings one tenant's occurrences due at one instant
together, so the slot that receives it claims the leading items whose handlers this pool
process has seen finish quickly (run_times.py: by the 95th percentile, within
`TICK_ENVELOPE_RUN_BUDGET_MS` together), fans out the others (fanout.py), runs the run's
items one after another, and writes their successes in one statement.

Only the claim's common case forms a run: a first attempt on time, in an on-time lane, of an
ALLOW schedule that is not canceled or failing (no DEAD streak), not asked to cancel, of a
tenant under its `max_running` and share, on the first item's day. Everything else (and a
run of fewer than two) goes through the one-item path unchanged (claim.py), which judges it.

Lock story — one transaction, locks in the order of locks.py (rows → tenant):
a. wait for the first item's row (FOR UPDATE): a worker often receives an envelope before
   the relay committed its record of the rows, and the relay records them together;
b. lock the other runnable rows SKIP LOCKED (waiting for several rows in turn could
   deadlock with the relay's record statement, which locks a batch in its own order), and
   take the tenant lock once two are held (a, b and the lock are one statement);
c. while the tenant holds fewer slots than its bound, open every
   chosen item's attempt (own lease token, the same expiry) and move them to RUNNING in one
   statement. A run holds one slot, so slots are counted as distinct worker ids (claim.py).
The transaction commits before any handler runs; from then on each attempt's lease is its
claim, as in claim.py: a slot that dies mid-run leaves the remaining attempts to expire and
the reaper re-queues each (same occurrence id). Before each item a lease older than a third
of its length is renewed for the rest of the run, fenced by token (an item whose lease was
lost is not run). Successes are written with `completions_record` (complete_batch.py, one
transaction, each fenced by its lease); members whose row was busy are written together once
more after a short wait; failures, and members still busy, complete one by one (run.py).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from apps.occurrences.execution.claim import (
    CLAIM_ROW_COLUMNS,
    Claim,
    ClaimRow,
    claimed,
    observe_start,
)
from apps.occurrences.execution.complete_batch import (
    Completion,
    Recorded,
    batchable,
    completions_record,
)
from apps.occurrences.execution.locks import tenant_lock, tenant_lock_sql
from apps.occurrences.execution.presence import tenant_slot_limit
from apps.occurrences.execution.run import (
    completion_record,
    handler_run,
    log_ids,
    through_worker_outages,
)
from apps.occurrences.execution.run_times import handler_times
from apps.occurrences.execution.statements import (
    ATTEMPT_ROW_TABLE,
    OCCURRENCE_ROW_TABLE,
    execute_prepared,
    on_row_partitions,
)
from apps.occurrences.models import Attempt, Lane, Occurrence, attempt_open_by_key
from apps.occurrences.observability import metrics
from apps.occurrences.pipeline.outages import outage_of
from apps.schedules.models import Schedule

log = logging.getLogger(__name__)

Key = tuple[uuid.UUID, datetime]


@dataclass
class EnvelopeRun:
    """The items claimed as a run (in envelope order) and the envelope's other items."""

    claims: list[Claim] = field(default_factory=list)
    rest: list[dict[str, Any]] = field(default_factory=list)


# Steps a and b, then the tenant lock, in one statement: `first` is read whole before the
# other rows are taken (a count of it is in their condition), and the tenant lock is taken
# once two runnable rows are locked (its subquery reads the second), before the rest are
# taken SKIP LOCKED, so nothing waits while it is held.
_LOCK_RUN = f"""
    WITH first AS MATERIALIZED (
        SELECT 1 FROM {OCCURRENCE_ROW_TABLE}
        WHERE id = %(first_id)s AND scheduled_for = %(first_at)s FOR UPDATE
    ), r AS MATERIALIZED (
        SELECT o.id, o.scheduled_for, {CLAIM_ROW_COLUMNS}
        FROM {OCCURRENCE_ROW_TABLE} o
        JOIN unnest(%(ids)s::uuid[], %(ats)s::timestamptz[]) AS k(id, at)
          ON o.id = k.id AND o.scheduled_for = k.at
        JOIN schedules_schedule s ON s.id = o.schedule_id
        JOIN tenants_tenant t ON t.id = o.tenant_id
        WHERE (SELECT count(*) FROM first) >= 0
          AND o.state IN (%(scheduled)s, %(enqueued)s) AND o.attempt_count = 0
          AND o.origin = %(origin_scheduled)s AND o.cancel_requested_at IS NULL
          AND o.lane <> %(catchup_lane)s AND s.overlap_policy = %(allow)s
          AND s.state <> %(canceled)s AND s.dead_streak = 0
          AND %(now)s - o.available_at <= make_interval(secs => s.max_lateness_s)
        FOR UPDATE OF o SKIP LOCKED
    )
    SELECT r.*, (SELECT {tenant_lock_sql("x.tenant_id")} FROM r x OFFSET 1 LIMIT 1) FROM r
"""

# Step c, after the tenant lock: the tenant's slots and, under `below`, every attempt of the
# run opened and its occurrence RUNNING (the foreign key is checked at the statement's end).
_OPEN_RUN = f"""
    WITH running AS (
        SELECT count(DISTINCT worker_id) AS n FROM occurrences_attempt
        WHERE tenant_id = %(tenant)s AND finished_at IS NULL
    ), c AS (
        SELECT * FROM unnest(%(ids)s::uuid[], %(ats)s::timestamptz[], %(attempts)s::uuid[],
                             %(tokens)s::uuid[]) AS c(id, at, attempt_id, token)
    ), attempt AS (
        INSERT INTO {ATTEMPT_ROW_TABLE}
            (id, scheduled_for, occurrence_id, tenant_id, attempt_no, lease_token,
             lease_expires_at, worker_id, started_at, finished_at, outcome,
             error_class, error_message)
        SELECT c.attempt_id, c.at, c.id, %(tenant)s, 1, c.token, %(expires)s, %(worker)s,
               %(now)s, NULL, '', '', ''
        FROM c, running WHERE running.n < %(below)s
        RETURNING occurrence_id, scheduled_for
    )
    UPDATE {OCCURRENCE_ROW_TABLE} o SET state = %(running_state)s, attempt_count = 1
    FROM attempt a WHERE o.id = a.occurrence_id AND o.scheduled_for = a.scheduled_for
    RETURNING o.id, o.lane, o.available_at
"""

# Before an item whose lease has aged: the rest of the run's leases renewed, fenced by token.
_RENEW = f"""
    UPDATE {ATTEMPT_ROW_TABLE} a SET lease_expires_at = now() + make_interval(secs => %(lease)s)
    FROM unnest(%(ids)s::uuid[], %(ats)s::timestamptz[], %(tokens)s::uuid[]) AS c(id, at, token)
    WHERE a.id = c.id AND a.scheduled_for = c.at AND a.lease_token = c.token
      AND {attempt_open_by_key("a")}
    RETURNING a.id
"""


def envelope_run_claim(
    items: Sequence[dict[str, Any]], *, worker_id: str, now: datetime | None = None
) -> EnvelopeRun:
    """Claim a run of the envelope's `items` (module docstring); the items not claimed are
    returned as `rest`, in envelope order. Runs off, or fewer than two runnable: no claim."""
    budget_s = settings.TICK_ENVELOPE_RUN_BUDGET_MS / 1000
    keys = _same_day_keys(items)
    # A process that knows no handler short enough (webhooks only) pays no statement here.
    if budget_s <= 0 or len(keys) < 2 or not handler_times.any_within(budget_s / 2):
        return EnvelopeRun(rest=list(items))
    now = now or timezone.now()
    with transaction.atomic(), connection.cursor() as cursor:
        rows = _lock_runnable(cursor, keys, now)
        chosen = _within_budget(rows, budget_s)
        opened = _open_run(cursor, chosen, worker_id, now) if len(chosen) >= 2 else {}
    claims = [claimed(row, 1, *opened[row.occurrence_id]) for row in chosen
              if row.occurrence_id in opened]  # fmt: skip
    return EnvelopeRun(claims, [item for item in items if _item_id(item) not in opened])


def _item_id(item: Any) -> uuid.UUID | None:
    key = _key(item) if isinstance(item, dict) else None
    return key[0] if key else None


def _key(item: dict[str, Any]) -> Key | None:
    try:
        return uuid.UUID(str(item["occurrence_id"])), datetime.fromisoformat(item["scheduled_for"])
    except (KeyError, TypeError, ValueError):
        return None


def _same_day_keys(items: Sequence[dict[str, Any]]) -> list[Key]:
    """The items' keys on the first item's day, in envelope order (a run names one day's
    partitions; the others fan out)."""
    keys = [k for k in (_key(item) for item in items if isinstance(item, dict)) if k is not None]
    if not keys:
        return []
    day = keys[0][1].astimezone(UTC).date()
    return [k for k in keys if k[1].astimezone(UTC).date() == day]


def _lock_runnable(cursor: CursorWrapper, keys: list[Key], now: datetime) -> list[ClaimRow]:
    """Steps a and b (and the tenant lock, `_LOCK_RUN`): the runnable rows of the first
    one's tenant, locked, in envelope order."""
    first_id, first_at = keys[0]
    found = execute_prepared(cursor, on_row_partitions(_LOCK_RUN, first_at, now), {
        "first_id": first_id, "first_at": first_at,
        "ids": [k[0] for k in keys], "ats": [k[1] for k in keys], "now": now,
        "scheduled": Occurrence.State.SCHEDULED, "enqueued": Occurrence.State.ENQUEUED,
        "origin_scheduled": Occurrence.Origin.SCHEDULED, "catchup_lane": Lane.CATCHUP,
        "allow": Schedule.OverlapPolicy.ALLOW, "canceled": Schedule.State.CANCELED,
    }).fetchall()  # fmt: skip
    # The lock was taken on one row's tenant: it is this run's when the envelope holds one
    # tenant, as the relay builds them.
    locked = len({r[5] for r in found}) == 1
    rows = {r[0]: ClaimRow(*[*r[:-1], locked and bool(r[-1])]) for r in found}
    ordered = [rows[k[0]] for k in keys if k[0] in rows]
    tenant = ordered[0].tenant_id if ordered else None
    return [row for row in ordered if row.tenant_id == tenant]


def _within_budget(rows: list[ClaimRow], budget_s: float) -> list[ClaimRow]:
    """The leading rows whose handlers' run times (95th percentile) add up to the budget; a
    handler not yet known here ends the run."""
    chosen: list[ClaimRow] = []
    spent = 0.0
    for row in rows:
        p95 = handler_times.p95_s(row.handler)
        if p95 is None or (chosen and spent + p95 > budget_s):
            break
        chosen.append(row)
        spent += p95
    return chosen


def _open_run(
    cursor: CursorWrapper, rows: list[ClaimRow], worker_id: str, now: datetime
) -> dict[uuid.UUID, tuple[uuid.UUID, uuid.UUID]]:
    """Step c: occurrence id → (attempt id, lease token) of every attempt opened; none while
    the tenant holds its bound of slots."""
    first = rows[0]
    share = tenant_slot_limit()  # cached per process: read before the lock, not under it
    if not first.tenant_locked:
        tenant_lock(cursor, first.tenant_id)
    keys = {row.occurrence_id: (uuid.uuid4(), uuid.uuid4()) for row in rows}
    found = execute_prepared(cursor, on_row_partitions(_OPEN_RUN, first.scheduled_for, now), {
        "tenant": first.tenant_id, "ids": [r.occurrence_id for r in rows],
        "ats": [r.scheduled_for for r in rows],
        "attempts": [keys[r.occurrence_id][0] for r in rows],
        "tokens": [keys[r.occurrence_id][1] for r in rows],
        "expires": now + timedelta(seconds=settings.TICK_ATTEMPT_LEASE_S),
        "worker": worker_id[:200], "now": now, "running_state": Occurrence.State.RUNNING,
        "below": min(first.max_running, first.max_running if share is None else share),
    }).fetchall()  # fmt: skip
    by_id = {row.occurrence_id: row for row in rows}
    for occurrence_id, lane, available_at in found:
        observe_start(by_id[occurrence_id], now, lane=lane, available_at=available_at)
    return {occurrence_id: keys[occurrence_id] for occurrence_id, _, _ in found}


def envelope_run_execute(run: EnvelopeRun) -> list[str]:
    """Run the run's items one after another in this slot, then write their successes
    together (module docstring); returns each item's status."""
    statuses: list[str] = []
    successes: dict[uuid.UUID, Claim] = {}
    renewed = time.monotonic()
    for index, claim in enumerate(run.claims):
        if time.monotonic() - renewed > settings.TICK_ATTEMPT_LEASE_S / 3:
            if claim.attempt_id not in _renew(run.claims[index:]):
                statuses.append("stale")
                continue
            renewed = time.monotonic()
        error = handler_run(claim)
        if batchable(claim, error):
            assert claim.attempt_id is not None
            successes[claim.attempt_id] = claim
        else:
            statuses.append(str(completion_record(claim, error)["status"]))
    return statuses + _record_successes(successes)


def _renew(claims: list[Claim]) -> set[uuid.UUID]:
    """Renew the leases of `claims` (one day); returns the attempt ids still held."""
    ats = [c.context.scheduled_for for c in claims if c.context is not None]
    statement = on_row_partitions(_RENEW, ats[0], timezone.now())
    with connection.cursor() as cursor:
        found = execute_prepared(cursor, statement, {
            "lease": settings.TICK_ATTEMPT_LEASE_S, "ids": [c.attempt_id for c in claims],
            "ats": ats, "tokens": [c.lease_token for c in claims],
        }).fetchall()  # fmt: skip
    return {row[0] for row in found}


# A member passed by had its row held by the relay's record statement, tens of milliseconds
# for a batch (docs/performance.md "Attempts found by their key (runs S1–S4)"): the run
# writes those members together once more after this long, and those still busy one by one.
PASSED_BY_RETRY_S = 0.05


def _record_successes(successes: dict[uuid.UUID, Claim]) -> list[str]:
    """Write the run's successes in one transaction, retried through an outage; members whose
    row was busy are written together once more after `PASSED_BY_RETRY_S`, then on their own;
    one never written is left to its lease."""
    if not successes:
        return []
    finished_at = timezone.now()
    batch = [Completion.of(claim, finished_at) for claim in successes.values()]
    recorded = _recorded(batch)
    if recorded is not None and recorded.passed_by:
        time.sleep(PASSED_BY_RETRY_S)
        again = _recorded([c for c in batch if c.attempt_id in recorded.passed_by])
        if again is not None:
            recorded = Recorded(recorded.succeeded | again.succeeded, again.passed_by)
    if recorded is None:
        return ["unrecorded"] * len(batch)
    if recorded.succeeded:
        metrics.attempts_finished.labels(outcome=Attempt.Outcome.SUCCEEDED).inc(
            len(recorded.succeeded)
        )
    for attempt_id in recorded.succeeded:
        claim = successes[attempt_id]
        assert claim.context is not None
        log.info("occurrence %s attempt %s: succeeded (run of %d)", claim.context.occurrence_id,
                 claim.context.attempt_no, len(batch), extra=log_ids(claim))  # fmt: skip
    statuses = [str(Occurrence.State.SUCCEEDED)] * len(recorded.succeeded)
    for attempt_id in recorded.passed_by:
        statuses.append(str(completion_record(successes[attempt_id], None)["status"]))
    stale = len(batch) - len(recorded.succeeded) - len(recorded.passed_by)
    if stale:
        metrics.stale_completions.inc(stale)
    log.info("a run of %d: %d succeeded, %d on their own, %d stale", len(batch),
             len(recorded.succeeded), len(recorded.passed_by), stale)  # fmt: skip
    return statuses + ["stale"] * stale


def _recorded(batch: list[Completion]) -> Recorded | None:
    """`completions_record` retried through an outage; None when it could not be written (the
    reaper re-queues the members when their leases expire)."""
    try:
        return through_worker_outages(
            lambda: completions_record(batch), who=f"completion of a run of {len(batch)}"
        )
    except Exception as exc:
        if outage_of(exc) is None:
            raise
        log.error("a run of %d: completions not recorded (%r); the reaper re-queues them when "
                  "their leases expire", len(batch), exc)  # fmt: skip
        return None
