"""Schedule changes that recall occurrences: update, pause, resume, cancel.

Each runs in one transaction. The schedule row is locked and written through
apps.schedules.services (versions, events); the recall of what the change invalidates
(outbox rows, occurrences) and the receipt of what it did are done here, by the app that owns
those rows.

Update, pause and cancel share one concurrency story (`_recall`), run while the schedule row
is locked `FOR UPDATE`:
1. The lock serialises with the materializer, whose due scan is `FOR UPDATE SKIP LOCKED`: a
   batch holding the row finishes first (its occurrences are then visible here); a later
   batch skips the row until commit and then reads the new version / state.
2. `relay_shard_barrier(shard)` takes the shard's relay lease row FOR UPDATE: a relay step
   holds it FOR KEY SHARE from its outbox read until its last publish, so this waits for a step
   in flight and holds off the next one. Then the outbox rows of the affected occurrences are
   deleted. Rows the relay already recorded are gone (ENQUEUED: reported not recalled); rows
   published but not yet recorded are recalled here too, and the worker's claim drops their
   message (their state is no longer claimable). The relay never publishes a row before its
   `available_at`, so a deleted row not yet due was never published (receipt: `invalidated`);
   one already due may have been (receipt: `dropped_at_claim`, docs/decisions.md "Lifecycle
   API"). Nothing affected is published after commit.
   The relay never locks schedules and this code touches occurrences only after the
   barrier, so the two cannot deadlock.
3. The occurrences whose outbox row was deleted and that are still SCHEDULED (or RETRY_WAIT,
   for update and cancel) become SUPERSEDED / CANCELED in the same statement: set-based, no
   per-row saves.
4. What could not be recalled (in flight, or at/after the change and already finished) is
   read back for the receipt.

Resume takes back what the last pause canceled and is still in the future (`_RESTORE`): the
same occurrence ids go CANCELED -> SCHEDULED with a fresh outbox row, in the resume's
transaction (docs/decisions.md "Lifecycle API").
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.occurrences.models import Lane, Occurrence
from apps.occurrences.pipeline.leases import relay_shard_barrier
from apps.occurrences.pipeline.materializer import MaterializeConfig, old_version_until_boundary
from apps.occurrences.pipeline.outbox import outbox_insert
from apps.occurrences.pipeline.relay import RELAY_CLOCK_SLACK
from apps.schedules.errors import StateConflict
from apps.schedules.models import Schedule, ScheduleEvent
from apps.schedules.services import (
    ScheduleSpec,
    apply_new_version,
    changed_definition_fields,
    check_tenant_limits,
    lock_schedule,
    mark_active,
    mark_canceled,
    mark_paused,
    next_run_for_new_version,
    schedule_rename,
)

# Receipts list at most this many occurrences per kind (ordered by instant).
RECEIPT_LIMIT = 1000

# Not yet handed to a worker: update and cancel recall both; pause lets pending retries run.
_PENDING = (Occurrence.State.SCHEDULED, Occurrence.State.RETRY_WAIT)
IN_FLIGHT = (Occurrence.State.ENQUEUED, Occurrence.State.RUNNING, Occurrence.State.RETRY_WAIT)
FINISHED = (Occurrence.State.SUCCEEDED, Occurrence.State.DEAD, Occurrence.State.SKIPPED_OVERLAP)
# Outbox lanes a recall leaves alone: pause lets pending retries run; cancel keeps none.
PAUSE_KEEPS = (Lane.RETRY,)
# What a recall leaves behind: these instants are free for the new version.
_DROPPED = (Occurrence.State.SUPERSEDED, Occurrence.State.CANCELED)


@dataclass(frozen=True)
class NotRecalled:
    """An affected occurrence already handed to the queue (or run): it cannot be pulled back.
    It runs (the new version starts after it); the worker's claim still drops it if the
    schedule was canceled."""

    id: uuid.UUID
    state: str
    scheduled_for: datetime
    schedule_version: int


@dataclass(frozen=True)
class Restored:
    """An occurrence the last pause canceled that resume made SCHEDULED again (same id)."""

    id: uuid.UUID
    scheduled_for: datetime


@dataclass(frozen=True)
class Recalled:
    """The occurrences a recall took back (now SUPERSEDED / CANCELED), in instant order:
    `unpublished` had their outbox row deleted before it was due, so their message was never
    published; `maybe_published` were already due, so the relay may have published them
    without recording it yet, and the worker's claim drops such a message."""

    unpublished: list[uuid.UUID]
    maybe_published: list[uuid.UUID]

    def __len__(self) -> int:
        return len(self.unpublished) + len(self.maybe_published)


@dataclass(frozen=True)
class Receipt:
    """What a lifecycle change actually did, decided in the transaction that made it."""

    action: ScheduleEvent.Kind
    at: datetime
    version: int
    # Recalled before publication: their message was never published; they never run.
    invalidated: list[uuid.UUID] = field(default_factory=list)
    # SUPERSEDED (update) or CANCELED (pause, cancel); None when nothing was recalled.
    invalidated_state: Occurrence.State | None = None
    not_recalled: list[NotRecalled] = field(default_factory=list)
    # Recalled at or after their publish time: the relay may have published their message
    # (published, not yet recorded); if it is delivered, the claim drops it: they never run.
    dropped_at_claim: list[uuid.UUID] = field(default_factory=list)
    # Resume: the future instants the last pause canceled, scheduled again (same ids).
    restored: list[Restored] = field(default_factory=list)


@dataclass(frozen=True)
class LifecycleResult:
    schedule: Schedule
    receipt: Receipt


# Steps 2 and 3 in one statement, after `relay_shard_barrier`: rows a relay already published
# (and deleted) are not in `gone`; rows published but not yet recorded are, and their
# occurrences are dropped by the worker's claim (no longer claimable). `due`: the row's
# publish time had come (`published_by`), so it may be one of those. `shard` narrows the scan
# to the schedule's shard through outbox_due_idx.
_RECALL = """
    WITH gone AS (
        DELETE FROM occurrences_dispatchoutbox
        WHERE shard = %(shard)s AND schedule_id = %(schedule)s
          AND schedule_version < %(below)s AND NOT (lane = ANY(%(keep_lanes)s::text[]))
        RETURNING occurrence_id, scheduled_for,
                  parked_at IS NULL AND available_at <= %(published_by)s AS due
    ),
    recalled AS (
        SELECT occurrence_id, scheduled_for, bool_or(due) AS due FROM gone GROUP BY 1, 2
    )
    UPDATE occurrences_occurrence o
    SET state = %(to_state)s, finished_at = %(now)s
    FROM recalled
    WHERE o.id = recalled.occurrence_id AND o.scheduled_for = recalled.scheduled_for
      AND o.schedule_id = %(schedule)s AND o.state = ANY(%(from_states)s::text[])
    RETURNING o.id, o.scheduled_for, recalled.due
"""

# Whether `_RECALL` would delete any outbox row (the same rows, through outbox_due_idx).
_HAS_RECALLABLE = """
    SELECT 1 FROM occurrences_dispatchoutbox
    WHERE shard = %(shard)s AND schedule_id = %(schedule)s
      AND schedule_version < %(below)s AND NOT (lane = ANY(%(keep_lanes)s::text[]))
    LIMIT 1
"""

# A fresh outbox row for each occurrence a resume brings back.
_RESTORED_OUTBOX = outbox_insert(
    occurrence_id="id", schedule_version="version", source="FROM back", returning="RETURNING 1"
)

# Resume, for one schedule (the verb) or many (bulk_batches.py): each one's current version's
# occurrences its last pause canceled (`finished_at` is the pause's instant, as its `paused`
# event's `at`), never published nor tried, whose instant is still ahead, go back to
# SCHEDULED with a fresh outbox row in one statement. Same ids: a copy of one that the relay
# did publish would be a duplicate the claim drops, never a second run. The caller's SELECT
# over `back` follows (`restore_canceled`).
_RESTORE = f"""
    WITH sel AS (
        SELECT * FROM unnest(%(ids)s::uuid[], %(shards)s::int[], %(versions)s::int[])
            AS t(schedule_id, shard, version)
    ),
    paused AS (
        SELECT schedule_id, max(at) AS at FROM schedules_scheduleevent
        WHERE schedule_id = ANY(%(ids)s::uuid[]) AND kind = %(paused)s
        GROUP BY schedule_id
    ),
    back AS (
        UPDATE occurrences_occurrence o
        SET state = %(scheduled)s, finished_at = NULL
        FROM paused JOIN sel USING (schedule_id)
        WHERE o.schedule_id = sel.schedule_id AND o.schedule_version = sel.version
          AND o.scheduled_for > %(now)s AND o.state = %(canceled)s
          AND o.finished_at = paused.at AND o.enqueued_at IS NULL AND o.attempt_count = 0
          AND o.cancel_requested_at IS NULL
        RETURNING o.id, o.scheduled_for, o.tenant_id, o.lane, o.available_at, o.schedule_id,
                  sel.version, sel.shard
    ),
    outbox AS ({_RESTORED_OUTBOX})
"""

# Step 4: in flight (may still run), or at/after the change instant and already finished.
_NOT_RECALLED = """
    SELECT id, state, scheduled_for, schedule_version
    FROM occurrences_occurrence
    WHERE schedule_id = %(schedule)s AND schedule_version < %(below)s
      AND scheduled_for >= %(since)s
      AND (state = ANY(%(in_flight)s::text[])
           OR (scheduled_for >= %(now)s AND state = ANY(%(finished)s::text[])))
    ORDER BY scheduled_for, id
    LIMIT %(limit)s
"""

# The latest future instant older versions produced and kept (published, running, finished):
# the new version starts after it, so no instant fires twice across versions.
_LATEST_KEPT = """
    SELECT max(scheduled_for) FROM occurrences_occurrence
    WHERE schedule_id = %(schedule)s AND schedule_version < %(below)s
      AND scheduled_for >= %(now)s AND NOT (state = ANY(%(dropped)s::text[]))
"""


def enum_values(members: Sequence[str]) -> list[str]:
    # The members' values as plain strings: what the state and lane columns hold.
    return [str(member) for member in members]


def _recall(
    *,
    schedule: Schedule,
    below: int,
    keep_lanes: Sequence[Lane],
    from_states: Sequence[Occurrence.State],
    to_state: Occurrence.State,
    now: datetime,
) -> Recalled:
    params: dict[str, Any] = {
        "shard": schedule.shard, "schedule": schedule.id, "below": below,
        "keep_lanes": enum_values(keep_lanes),
    }  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(_HAS_RECALLABLE, params)
        if cursor.fetchone() is None:
            # Nothing to recall, so no barrier: a relay step can only hold rows that are still
            # in the outbox (until recorded), and the materializer adds none while the
            # schedule is locked. Skipping it keeps a bulk pause of schedules with nothing
            # materialized from counting recalls that drop the relay's staged rows.
            return Recalled([], [])
    # Wait for (and hold off) the relay step in flight on this shard: what is deleted
    # below can then no longer be published after this transaction commits.
    relay_shard_barrier(schedule.shard)
    # Read after the barrier: a relay step it waited for may have published rows due while
    # it waited.
    published_by = timezone.now() + RELAY_CLOCK_SLACK
    with connection.cursor() as cursor:
        cursor.execute(_RECALL, {
            **params, "from_states": enum_values(from_states), "to_state": str(to_state),
            "now": now, "published_by": published_by,
        })  # fmt: skip
        rows = sorted(cursor.fetchall(), key=lambda r: (r[1], r[0]))
    return Recalled([r[0] for r in rows if not r[2]], [r[0] for r in rows if r[2]])


def schedule_columns(schedules: Sequence[Schedule]) -> dict[str, Any]:
    """The `ids`, `shards` and `versions` parameters of a statement over many schedules."""
    return {
        "ids": [s.id for s in schedules], "shards": [s.shard for s in schedules],
        "versions": [s.version for s in schedules],
    }  # fmt: skip


def restore_canceled(
    schedules: Sequence[Schedule], *, now: datetime, select: str
) -> list[tuple[Any, ...]]:
    """Resume's restore (`_RESTORE`) for `schedules`, each at its current version; `select`
    reads the restored rows from `back` (id, scheduled_for, tenant_id, lane, available_at,
    schedule_id, version, shard) and its rows are returned."""
    with connection.cursor() as cursor:
        cursor.execute(_RESTORE + select, {
            **schedule_columns(schedules), "now": now,
            "paused": str(ScheduleEvent.Kind.PAUSED),
            "scheduled": str(Occurrence.State.SCHEDULED),
            "canceled": str(Occurrence.State.CANCELED),
        })  # fmt: skip
        rows: list[tuple[Any, ...]] = cursor.fetchall()
    return rows


def _restore(*, schedule: Schedule, now: datetime) -> list[Restored]:
    rows = restore_canceled(
        [schedule], now=now, select="SELECT id, scheduled_for FROM back ORDER BY scheduled_for, id"
    )
    return [Restored(*row) for row in rows]


def _not_recalled(*, schedule: Schedule, below: int, now: datetime) -> list[NotRecalled]:
    with connection.cursor() as cursor:
        cursor.execute(_NOT_RECALLED, {
            "schedule": schedule.id, "below": below, "now": now,
            "since": now - timedelta(seconds=settings.TICK_RECEIPT_LOOKBACK_S),
            "in_flight": enum_values(IN_FLIGHT), "finished": enum_values(FINISHED),
            "limit": RECEIPT_LIMIT,
        })  # fmt: skip
        return [NotRecalled(*row) for row in cursor.fetchall()]


def _latest_kept(*, schedule: Schedule, below: int, now: datetime) -> datetime | None:
    with connection.cursor() as cursor:
        cursor.execute(_LATEST_KEPT, {
            "schedule": schedule.id, "below": below, "now": now, "dropped": enum_values(_DROPPED),
        })  # fmt: skip
        row = cursor.fetchone()
    return row[0] if row else None


def _receipt(
    action: ScheduleEvent.Kind,
    schedule: Schedule,
    now: datetime,
    recalled: Recalled,
    recalled_state: Occurrence.State,
    not_recalled: list[NotRecalled],
) -> Receipt:
    return Receipt(
        action, now, schedule.version, recalled.unpublished,
        recalled_state if len(recalled) else None, not_recalled,
        dropped_at_claim=recalled.maybe_published,
    )  # fmt: skip


def _recall_same_version(
    action: ScheduleEvent.Kind,
    schedule: Schedule,
    now: datetime,
    *,
    keep_lanes: Sequence[Lane],
    from_states: Sequence[Occurrence.State],
) -> Receipt:
    """Steps 2-4 for a change that keeps the version (pause, cancel): every version so far is
    affected, and what is recalled is CANCELED (there is no newer version to supersede it)."""
    below = schedule.version + 1
    canceled = Occurrence.State.CANCELED
    recalled = _recall(
        schedule=schedule, below=below, keep_lanes=keep_lanes, from_states=from_states,
        to_state=canceled, now=now,
    )  # fmt: skip
    not_recalled = _not_recalled(schedule=schedule, below=below, now=now)
    return _receipt(action, schedule, now, recalled, canceled, not_recalled)


def _recalled_count(receipt: Receipt) -> int:
    # Events count every occurrence the change recalled, published late or not (as update's).
    return len(receipt.invalidated) + len(receipt.dropped_at_claim)


def _refuse_stale_or_canceled(*, read: Schedule, locked: Schedule) -> None:
    # A change committed since `read` was read would be overwritten with stale merged fields.
    if locked.version != read.version or locked.name != read.name:
        raise StateConflict(
            "The schedule changed while this update was being prepared; read it and retry."
        )
    if locked.state == Schedule.State.CANCELED:
        raise StateConflict("A canceled schedule cannot be updated; create a new one.")


def refuse_unless(locked: Schedule, state: Schedule.State, change: str) -> None:
    if locked.state != state:
        raise StateConflict(
            f"A {locked.state.lower()} schedule cannot be {change} (only {state.lower()} ones)."
        )


def schedule_update(*, schedule: Schedule, spec: ScheduleSpec, actor: str) -> LifecycleResult:
    """Apply a validated full definition (the PATCH merged onto `schedule` as read).

    1. Lock the row; if another change committed since `schedule` was read (version or name
       differ), refuse (409) rather than overwrite it with stale merged fields.
    2. Only the name changed: rename, no new version, no occurrence touched.
    3. Definition changed: version + 1; older versions' unpublished occurrences become
       SUPERSEDED and their outbox rows go (module docstring); `next_run_at` is the new rule's
       first instant after max(now, latest instant an older version kept), so the new
       version re-fires only instants whose old occurrence was superseded here.
    4. The boundary is `now`: the old version owns the instants before it, the new one those
       after it. Old instants before it that no batch materialized (the materializer was
       behind) are produced now as a batch would have (late ones per the misfire policy, the
       rest MISSED with a `missed` event: `old_version_until_boundary`), so none falls
       between the versions unrecorded.
    5. Close the previous version's interval at the boundary, open the new one, log `updated`.
    """
    now = timezone.now()
    with transaction.atomic():
        locked = lock_schedule(schedule)
        _refuse_stale_or_canceled(read=schedule, locked=locked)
        changed = changed_definition_fields(schedule=locked, spec=spec)
        if not changed:
            schedule_rename(
                schedule=locked, name=spec.name, labels=spec.labels, actor=actor, now=now,
                pause_after_dead=spec.pause_after_dead,
            )  # fmt: skip
            return LifecycleResult(locked, Receipt(ScheduleEvent.Kind.UPDATED, now, locked.version))

        check_tenant_limits(schedule=locked, spec=spec, changed=changed)
        below = locked.version + 1
        recalled = _recall(
            schedule=locked, below=below, keep_lanes=[], from_states=_PENDING,
            to_state=Occurrence.State.SUPERSEDED, now=now,
        )  # fmt: skip
        kept = _latest_kept(schedule=locked, below=below, now=now)
        next_run_at = next_run_for_new_version(spec=spec, now=now, kept=kept)
        # The boundary: what the old version owed before `now` and no batch materialized
        # (the materializer was behind) is produced or recorded MISSED here, not lost between
        # versions; a late one-shot the new version still fires (its run_at) is the new one's.
        boundary = min(now, next_run_at) if next_run_at is not None else now
        missed = old_version_until_boundary(
            schedule=locked, boundary=boundary, now=now,
            config=MaterializeConfig.from_settings(), actor=actor,
        )  # fmt: skip
        not_recalled = _not_recalled(schedule=locked, below=below, now=now)
        apply_new_version(
            schedule=locked, spec=spec, changed=changed, next_run_at=next_run_at,
            actor=actor, now=now, invalidated=len(recalled), not_recalled=len(not_recalled),
            missed=missed,
        )  # fmt: skip
    receipt = _receipt(
        ScheduleEvent.Kind.UPDATED, locked, now, recalled, Occurrence.State.SUPERSEDED,
        not_recalled,
    )  # fmt: skip
    return LifecycleResult(locked, receipt)


def schedule_pause(*, schedule: Schedule, actor: str, reason: str = "") -> LifecycleResult:
    """Stop future materialization; cancel what is materialized but unpublished.

    `next_run_at` is kept: it is the first instant never materialized, so resume continues
    there and the misfire policy judges what was missed meanwhile. Retries of runs already in
    flight (RETRY_WAIT) continue and are listed as not recalled. Pausing a paused schedule
    changes nothing and logs nothing.
    """
    now = timezone.now()
    with transaction.atomic():
        locked = lock_schedule(schedule)
        if locked.state == Schedule.State.PAUSED:
            return LifecycleResult(locked, Receipt(ScheduleEvent.Kind.PAUSED, now, locked.version))
        refuse_unless(locked, Schedule.State.ACTIVE, "paused")
        receipt = _recall_same_version(
            ScheduleEvent.Kind.PAUSED, locked, now, keep_lanes=PAUSE_KEEPS,
            from_states=[Occurrence.State.SCHEDULED],
        )  # fmt: skip
        mark_paused(
            schedule=locked, actor=actor, now=now, reason=reason,
            invalidated=_recalled_count(receipt), not_recalled=len(receipt.not_recalled),
        )  # fmt: skip
    return LifecycleResult(locked, receipt)


def schedule_resume(*, schedule: Schedule, actor: str) -> LifecycleResult:
    """Make a paused schedule ACTIVE again from its persisted `next_run_at`.

    Instants never materialized that passed while paused are older than `now -
    max_lateness_s` when the materializer finds them, so its misfire policy decides (SKIP:
    MISSED; FIRE_ONCE: the latest fires; CATCHUP: up to `catchup_limit`), bounded as for any
    outage. Instants the pause canceled (materialized ahead of it) that are still ahead are
    restored: the same occurrences SCHEDULED again with a fresh outbox row, listed in the
    receipt (`restored`); those that passed while paused stay CANCELED. No relay barrier: the
    outbox rows are new, so no relay step can hold them before this commits.
    """
    now = timezone.now()
    restored: list[Restored] = []
    with transaction.atomic():
        locked = lock_schedule(schedule)
        if locked.state != Schedule.State.ACTIVE:  # resuming an active schedule changes nothing
            refuse_unless(locked, Schedule.State.PAUSED, "resumed")
            restored = _restore(schedule=locked, now=now)
            mark_active(schedule=locked, actor=actor, now=now, restored=len(restored))
    receipt = Receipt(ScheduleEvent.Kind.RESUMED, now, locked.version, restored=restored)
    return LifecycleResult(locked, receipt)


def schedule_cancel(*, schedule: Schedule, actor: str) -> LifecycleResult:
    """Cancel for good: state CANCELED, `next_run_at` NULL, pending unpublished occurrences
    (and pending retries) CANCELED with their outbox rows. Nothing is deleted; the versions
    and events stay for audit. Canceling again changes nothing and logs nothing (the receipt
    then lists only what is still in flight)."""
    now = timezone.now()
    with transaction.atomic():
        locked = lock_schedule(schedule)
        if locked.state == Schedule.State.CANCELED:
            not_recalled = _not_recalled(schedule=locked, below=locked.version + 1, now=now)
            return LifecycleResult(
                locked,
                Receipt(
                    ScheduleEvent.Kind.CANCELED, now, locked.version, not_recalled=not_recalled
                ),
            )
        receipt = _recall_same_version(
            ScheduleEvent.Kind.CANCELED, locked, now, keep_lanes=[], from_states=_PENDING
        )
        mark_canceled(
            schedule=locked, actor=actor, now=now,
            invalidated=_recalled_count(receipt), not_recalled=len(receipt.not_recalled),
        )  # fmt: skip
    return LifecycleResult(locked, receipt)
