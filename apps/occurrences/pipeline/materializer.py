"""Materialization: turn due schedule instants into occurrences and outbox rows
(docs/decisions.md "Materializer").

One batch, one transaction (`materialize_batch`):
1. Fence: lock this process's shard leases FOR KEY SHARE and keep only those still held.
2. Claim up to `batch_size` ACTIVE schedules of those shards with `next_run_at` inside the
   planning window, `FOR UPDATE SKIP LOCKED` through `schedule_due_idx`.
3. Compute each schedule's instants in [next_run_at, horizon] with timerules (memoised per
   rule), apply the misfire policy to instants older than now - max_lateness. The horizon
   is the window plus the planning span, cut at the latest point of the schedule's shard
   phase (`span_cut`): a schedule firing more often than the span is advanced once per
   span, and the advances of schedules sharing a rule spread over the span instead of
   falling together (docs/decisions.md "Fewer advances: a schedule written a span ahead").
4. One statement inserts the occurrences and, for those due to fire, their outbox rows; an
   instant already stored (a stale `next_run_at`) undoes it, and the batch is inserted again
   with `ON CONFLICT DO NOTHING` on the unique instant (outbox rows only for rows inserted).
5. One statement advances `next_run_at` conditionally on (version, old next_run_at), so a
   stale process can never move it backwards; schedules with nothing left are COMPLETED.
A crash before commit rolls all of it back (the next owner redoes it from the persisted
`next_run_at`); after commit the outbox rows exist, so publishing is the relay's duty.
"""

from __future__ import annotations

import functools
import hashlib
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.backends.utils import CursorWrapper

from apps.core.config import SettingsConfig, setting
from apps.occurrences.alert_records import record_schedule_event_alerts
from apps.occurrences.misfire import late_runs_allowed
from apps.occurrences.models import Lane, Occurrence, ShardLease, occurrence_id_for
from apps.occurrences.observability import metrics
from apps.occurrences.pipeline.bulk import array_literal
from apps.occurrences.pipeline.leases import LeaseSet
from apps.occurrences.pipeline.outbox import outbox_insert
from apps.occurrences.pipeline.partitions import (
    partition_name,
    partitions_ensure,
    partitions_missing,
)
from apps.schedules.models import Schedule, ScheduleEvent
from apps.schedules.services import rule_times_between

ONE_MICROSECOND = timedelta(microseconds=1)


class MaterializeConfig(SettingsConfig):
    window_s: int = setting("TICK_PLANNING_WINDOW_S")
    batch_size: int = setting("TICK_MATERIALIZE_BATCH")
    max_fires_per_pass: int = setting("TICK_MAX_FIRES_PER_PASS")
    missed_record_limit: int = setting("TICK_MISSED_RECORD_LIMIT")
    # How much further than the window a schedule taken up is written (built by hand: 0, to
    # the window).
    span_s: int = setting("TICK_PLANNING_SPAN_S", default=0)
    # The span's phases are spread over the shards (`span_cut`).
    shards_total: int = setting("TICK_SHARDS", default=256)

    def horizons(self, now: datetime) -> tuple[datetime, datetime]:
        """(claim_until, horizon): a schedule whose `next_run_at` is at or before the first
        is taken up; its instants are written up to its cut of the second (`span_cut`)."""
        claim_until = now + timedelta(seconds=self.window_s)
        return claim_until, claim_until + timedelta(seconds=self.span_s)


@dataclass
class BatchResult:
    schedules: int = 0
    inserted: int = 0
    conflicts: int = 0
    outboxed: int = 0
    missed: int = 0
    completed: int = 0
    lanes: Counter[str] = field(default_factory=Counter)

    def __iadd__(self, other: BatchResult) -> BatchResult:
        self.schedules += other.schedules
        self.inserted += other.inserted
        self.conflicts += other.conflicts
        self.outboxed += other.outboxed
        self.missed += other.missed
        self.completed += other.completed
        self.lanes.update(other.lanes)
        return self


@dataclass
class _Row:
    """Due schedule columns, as selected in step 2."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    kind: str
    expression: str
    time_zone: str
    dst_gap: str
    dst_fold: str
    version: int
    next_run_at: datetime
    precision: str
    flexible_window_s: int
    misfire_policy: str
    max_lateness_s: int
    catchup_limit: int
    end_at: datetime | None
    shard: int
    interval_s: int | None  # a fixed rate's period; its anchor is start_at
    start_at: datetime | None


@dataclass
class _Plan:
    """What one schedule contributes to a batch."""

    fire: list[tuple[datetime, str]]  # (instant, lane)
    missed: list[datetime]
    missed_total: int
    missed_exact: bool
    next_run_at: datetime | None

    @functools.cached_property
    def occurrences(self) -> list[tuple[datetime, str, str]]:
        """(instant, lane, state) of every occurrence row: the fires, then the MISSED ones.
        Computed once per plan, however many schedules of the batch share it."""
        scheduled: str = Occurrence.State.SCHEDULED
        missed: str = Occurrence.State.MISSED
        return [(instant, lane, scheduled) for instant, lane in self.fire] + [
            (instant, Lane.CATCHUP, missed) for instant in self.missed
        ]


class _NeedPartitions(Exception):
    def __init__(self, days: set[date]) -> None:
        super().__init__(f"missing partitions for {sorted(days)}")
        self.days = days


# A flexible row is planned this far before its window's end (at most half the window), so a
# relay running a few seconds behind still enqueues it inside the window, not only within the
# lag budget after its planned instant (docs/decisions.md "Flexible rows keep a margin").
FLEXIBLE_END_MARGIN_S = 10


def flexible_spread_s(window_s: int) -> int:
    """How many whole seconds of `window_s` a flexible row's planned instant spreads over:
    the window less its end margin."""
    return max(0, window_s - min(FLEXIBLE_END_MARGIN_S, window_s // 2))


# A flexible row's instant falls on a multiple of its step, so one tenant's rows of a step's
# seconds travel as one envelope and run together (docs/decisions.md "Flexible rows share
# their steps"): at most FLEXIBLE_STEP_MAX_S, and at least FLEXIBLE_STEPS_MIN steps a spread.
FLEXIBLE_STEP_MAX_S = 5
FLEXIBLE_STEPS_MIN = 20


def flexible_step_s(window_s: int) -> int:
    """Whole seconds between the instants a flexible row of `window_s` may be planned at."""
    return max(1, min(FLEXIBLE_STEP_MAX_S, flexible_spread_s(window_s) // FLEXIBLE_STEPS_MIN))


def flexible_available_at(
    occurrence_id: uuid.UUID, scheduled_for: datetime, window_s: int
) -> datetime:
    """A flexible row's planned instant: `scheduled_for` + H(occurrence_id) mod (the spread
    less one step), rounded up to a multiple of the step since the epoch, so it stays in
    [scheduled_for, scheduled_for + spread). A stable hash: the same in every process,
    forever, for the same occurrence."""
    spread, step = flexible_spread_s(window_s), flexible_step_s(window_s)
    if spread <= 0:
        return scheduled_for
    digest = hashlib.blake2b(occurrence_id.bytes, digest_size=8).digest()
    planned = scheduled_for + timedelta(seconds=int.from_bytes(digest, "big") % (spread - step + 1))
    if step == 1:
        return planned
    step_us = step * 1_000_000
    since_epoch_us = (planned - EPOCH) // ONE_MICROSECOND
    return EPOCH + ONE_MICROSECOND * (-(-since_epoch_us // step_us) * step_us)


def _fires(row: _Row, after: datetime, until: datetime, limit: int) -> list[datetime]:
    """Instants of `row` in (after, until], at most `limit`, ascending."""
    if row.end_at is not None and until >= row.end_at:
        until = row.end_at - ONE_MICROSECOND  # bounds are half-open: [start_at, end_at)
    if until <= after:
        return []
    if row.kind == Schedule.Kind.ONE_SHOT:
        return [row.next_run_at] if after < row.next_run_at <= until else []
    return rule_times_between(row, after, until, limit=limit)


def _latest_before(row: _Row, cutoff: datetime, keep: int) -> tuple[list[datetime], bool]:
    """The latest `keep` instants in [next_run_at, cutoff); second value: whether the list is
    every such instant. Widens a window back from `cutoff`, so a day-long outage of an
    every-minute schedule costs a few evaluations, not 1,440."""
    start = row.next_run_at - ONE_MICROSECOND
    span = timedelta(hours=1)
    while True:
        after = max(start, cutoff - span)
        found = _fires(row, after, cutoff - ONE_MICROSECOND, 100_000)
        if len(found) >= keep or after == start:
            return found[-keep:] if keep else [], after == start and len(found) <= keep
        span *= 8


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def span_cut(shard: int, horizon: datetime, span_s: int, shards_total: int) -> datetime:
    """The latest point at or before `horizon` of the form k * span + phase(shard), where the
    phases of the shards divide the span evenly: in (horizon - span, horizon]. A schedule
    claimed with the window is written up to it. The span's worth of instants a claim then
    writes ends at the same phase each time, so schedules that share a rule and were
    created together are advanced at their shards' phases, spread over the span, instead
    of all at once every span (and a claim after one writes a full span, not less)."""
    if span_s <= 0:
        return horizon
    span_us = span_s * 1_000_000
    phase_us = (shard % shards_total) * span_us // shards_total
    at_us = (horizon - EPOCH) // ONE_MICROSECOND
    return horizon - timedelta(microseconds=(at_us - phase_us) % span_us)


def _cut_plan(plan: _Plan, cut: datetime) -> _Plan:
    """`plan` without the instants after `cut`: the first of them becomes `next_run_at` (the
    first instant not materialized). Fires are ascending (late ones, then on time)."""
    kept = 0
    while kept < len(plan.fire) and plan.fire[kept][0] <= cut:
        kept += 1
    if kept == len(plan.fire):
        return plan
    return _Plan(
        fire=plan.fire[:kept], missed=plan.missed, missed_total=plan.missed_total,
        missed_exact=plan.missed_exact, next_run_at=plan.fire[kept][0],
    )  # fmt: skip


def _plan(row: _Row, now: datetime, horizon: datetime, config: MaterializeConfig) -> _Plan:
    cutoff = now - timedelta(seconds=row.max_lateness_s)
    on_time_lane = Lane.FLEXIBLE if row.precision == Schedule.Precision.FLEXIBLE else Lane.STRICT
    fire: list[tuple[datetime, str]] = []
    missed: list[datetime] = []
    missed_total, missed_exact = 0, True
    resume_after = row.next_run_at - ONE_MICROSECOND
    if row.next_run_at < cutoff:
        # Misfire: instants older than now - max_lateness, found from the persisted
        # next_run_at (never from "now"), judged by the rule the relay and the claim apply
        # too (misfire.py). Bookkeeping stays bounded whatever the outage.
        fire_late = late_runs_allowed(row.misfire_policy, row.catchup_limit)
        keep = fire_late + config.missed_record_limit
        late, complete = _latest_before(row, cutoff, keep)
        # The latest `fire_late` of them (all when fewer: a negative start would keep too few).
        fired = late[max(0, len(late) - fire_late) :] if fire_late else []
        missed = late[: len(late) - len(fired)]
        fire.extend((instant, Lane.CATCHUP) for instant in fired)
        if complete:
            missed_total = len(missed)
        else:
            missed_total, missed_exact = len(missed) + 1, False
        resume_after = cutoff - ONE_MICROSECOND
    on_time = _fires(row, resume_after, horizon, config.max_fires_per_pass + 1)
    capped = len(on_time) > config.max_fires_per_pass
    on_time = on_time[: config.max_fires_per_pass]
    fire.extend((instant, on_time_lane) for instant in on_time)
    if row.kind == Schedule.Kind.ONE_SHOT:
        next_run_at = None if (fire or missed) else row.next_run_at
    else:
        last = on_time[-1] if capped else max(horizon, resume_after)
        following = _fires(row, last, last + timedelta(days=366 * 8), 1)
        next_run_at = following[0] if following else None
    return _Plan(fire, missed, missed_total, missed_exact, next_run_at)


# The state test is spelled into the text, not passed as a parameter: schedule_due_idx is
# partial on `state = 'ACTIVE'`, and PostgreSQL uses a partial index only when the planned
# query's WHERE implies its predicate (a generic plan with `state = $1` would not).
# No ORDER BY: with `shard = ANY(…)` PostgreSQL 15 cannot return the index's rows in
# next_run_at order, so an ORDER BY fetches and sorts every due row for each batch (a 500k
# burst: 250 batches x up to 500k rows). Without it the index is read shard after shard,
# oldest first within each, and stops at the limit. Across shards, `_claim_due` takes the
# instants nearest first by asking for them in two time ranges.
SELECT_DUE = f"""
    SELECT id, tenant_id, kind, expression, time_zone, dst_gap, dst_fold, version, next_run_at,
           precision, flexible_window_s, misfire_policy, max_lateness_s, catchup_limit, end_at,
           shard, interval_s, start_at
    FROM schedules_schedule
    WHERE state = '{Schedule.State.ACTIVE.value}' AND next_run_at IS NOT NULL
      AND shard = ANY(%(shards)s) AND next_run_at > %(after)s AND next_run_at <= %(until)s
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
"""
# `_claim_due`'s first range: instants up to this far past the pass's clock come first.
URGENT_RANGE = timedelta(seconds=10)
# Its lower bound: before any instant a schedule can have.
DISTANT_PAST = EPOCH

# The outbox rows of the occurrences just inserted that are due to fire.
_INSERTED_OUTBOX = outbox_insert(
    occurrence_id="r.id", scheduled_for="r.scheduled_for", schedule_id="r.schedule_id",
    schedule_version="r.version", tenant_id="r.tenant_id", shard="r.shard", lane="r.lane",
    available_at="r.available_at",
    source="FROM ins JOIN rows r ON r.id = ins.id AND r.scheduled_for = ins.scheduled_for"
    " WHERE ins.state = %(scheduled_state)s",
    returning="RETURNING 1",
)  # fmt: skip

_INSERT_OCCURRENCES = f"""
    WITH rows AS (
        SELECT * FROM unnest(
            %(id)s::uuid[], %(at)s::timestamptz[], %(schedule)s::uuid[], %(version)s::int[],
            %(tenant)s::uuid[], %(lane)s::text[], %(state)s::text[], %(available)s::timestamptz[],
            %(shard)s::smallint[]
        ) AS r(id, scheduled_for, schedule_id, version, tenant_id, lane, state, available_at,
               shard)
    ),
    ins AS (
        INSERT INTO occurrences_occurrence
            (id, scheduled_for, schedule_id, schedule_version, tenant_id, lane, state,
             available_at, enqueued_at, attempt_count, created_at, finished_at)
        SELECT id, scheduled_for, schedule_id, version, tenant_id, lane, state, available_at,
               NULL, 0, %(now)s, CASE WHEN state = %(missed_state)s THEN %(now)s::timestamptz END
        FROM rows
        ON CONFLICT DO NOTHING
        RETURNING id, scheduled_for, state
    ),
    outbox AS ({_INSERTED_OUTBOX})
    SELECT (SELECT count(*) FROM ins), (SELECT count(*) FROM outbox)
"""
# The same without ON CONFLICT, tried first (`_insert_occurrences`).
_INSERT_NEW_OCCURRENCES = _INSERT_OCCURRENCES.replace("ON CONFLICT DO NOTHING", "")
assert _INSERT_NEW_OCCURRENCES != _INSERT_OCCURRENCES
_OCCURRENCE_COLUMNS = (
    "id", "at", "schedule", "version", "tenant", "lane", "state", "available", "shard",
)  # fmt: skip

_ADVANCE = """
    UPDATE schedules_schedule s
    SET next_run_at = v.next_run_at, state = v.state, updated_at = %(now)s
    FROM unnest(%(id)s::uuid[], %(version)s::int[], %(old)s::timestamptz[],
                %(next)s::timestamptz[], %(state)s::text[])
        AS v(id, version, old_next_run_at, next_run_at, state)
    WHERE s.id = v.id AND s.version = v.version AND s.next_run_at = v.old_next_run_at
      AND s.state = %(active)s
"""
_ADVANCE_COLUMNS = ("id", "version", "old", "next", "state")


def materialize_batch(
    *,
    leases: LeaseSet,
    now: datetime,
    config: MaterializeConfig,
    elapsed: timedelta = timedelta(0),
) -> BatchResult:
    """Materialize one batch of due schedules (module docstring, steps 1-5). `elapsed`: how
    long the pass has run since `now` (its instants due by then come first).

    Returns what it did; `schedules == 0` means nothing was due in the held shards.
    """
    try:
        return _materialize_batch(leases=leases, now=now, config=config, elapsed=elapsed)
    except _NeedPartitions as need:
        # A late instant fell on a day without a partition: create it outside the batch's
        # transaction (DDL must not hold locks on the hot path), then redo the batch.
        partitions_ensure(need.days)
        return _materialize_batch(leases=leases, now=now, config=config, elapsed=elapsed)


def _materialize_batch(
    *, leases: LeaseSet, now: datetime, config: MaterializeConfig, elapsed: timedelta
) -> BatchResult:
    claim_until, horizon = config.horizons(now)
    urgent = now + elapsed + URGENT_RANGE
    with transaction.atomic(), connection.cursor() as cursor:
        rows = _claim_due(cursor, leases, urgent, claim_until, config.batch_size)
        if not rows:
            return BatchResult()
        batch = _plan_batch(rows, now, horizon, config)
        missing = partitions_missing(batch.text.days())
        if missing:
            raise _NeedPartitions(missing)
        _write_batch(cursor, batch, now)
    _count_batch(batch.result)
    return batch.result


def _claim_due(
    cursor: CursorWrapper, leases: LeaseSet, urgent: datetime, claim_until: datetime, limit: int
) -> list[_Row]:
    """Steps 1-2: the fence, then the due schedules of the shards still held, row-locked:
    those due by `urgent` first, then the rest of the planning window."""
    shards = leases.fenced_shards()
    if not shards:
        return []
    rows: list[_Row] = []
    for after, until in ((DISTANT_PAST, min(urgent, claim_until)), (urgent, claim_until)):
        if until <= after or len(rows) >= limit:
            continue
        cursor.execute(SELECT_DUE, {
            "shards": shards, "after": after, "until": until, "limit": limit - len(rows),
        })  # fmt: skip
        rows.extend(_Row(*values) for values in cursor.fetchall())
    return rows


def _plan_batch(
    rows: list[_Row], now: datetime, horizon: datetime, config: MaterializeConfig
) -> _BatchWrites:
    """Step 3 for every claimed schedule, as the column arrays of steps 4-5."""
    batch = _BatchWrites(now)
    batch.result.schedules = len(rows)
    # Schedules sharing a rule and a next_run_at share a plan: at the top of an hour most
    # of a batch does, so each distinct plan is computed once per batch, to the horizon,
    # and cut once per distinct cut.
    plans: dict[tuple[Any, ...], _Plan] = {}
    cut_plans: dict[tuple[Any, ...], _Plan] = {}
    cuts: dict[int, datetime] = {}
    shards_total = config.shards_total
    for row in rows:
        key = (row.kind, row.expression, row.time_zone, row.dst_gap, row.dst_fold,
               row.next_run_at, row.precision, row.misfire_policy, row.max_lateness_s,
               row.catchup_limit, row.end_at, row.interval_s, row.start_at)  # fmt: skip
        cut = cuts.get(row.shard)
        if cut is None:
            cut = cuts[row.shard] = span_cut(row.shard, horizon, config.span_s, shards_total)
        plan = cut_plans.get((key, cut))
        if plan is None:
            whole = plans.get(key)
            if whole is None:
                whole = plans[key] = _plan(row, now, horizon, config)
            plan = cut_plans[(key, cut)] = _cut_plan(whole, cut)
        batch.add(row, plan)
    return batch


def _write_batch(cursor: CursorWrapper, batch: _BatchWrites, now: datetime) -> None:
    """Steps 4-5: insert the occurrences and their outbox rows, advance the schedules, add
    their events."""
    result = batch.result
    if batch.occurrences["id"]:
        result.inserted, result.outboxed = _insert_occurrences(cursor, {
            **{k: array_literal(batch.occurrences[k]) for k in _OCCURRENCE_COLUMNS},
            "now": now,
            "missed_state": Occurrence.State.MISSED,
            "scheduled_state": Occurrence.State.SCHEDULED,
        })  # fmt: skip
        result.conflicts = len(batch.occurrences["id"]) - result.inserted
    cursor.execute(_ADVANCE, {
        **{k: array_literal(batch.advance[k]) for k in _ADVANCE_COLUMNS},
        "now": now,
        "active": Schedule.State.ACTIVE,
    })  # fmt: skip
    if batch.events:
        ScheduleEvent.objects.bulk_create(batch.events)
        record_schedule_event_alerts(cursor, batch.events)


def _insert_occurrences(cursor: CursorWrapper, params: dict[str, Any]) -> tuple[int, int]:
    """Step 4: (occurrences inserted, outbox rows inserted). A plain INSERT first: ON CONFLICT
    makes every row a speculative insertion (each unique index probed before the insert, one
    more WAL record to confirm it), paid on every batch for a conflict that only a stale
    `next_run_at` causes. On a conflict the savepoint is undone and the batch goes through
    ON CONFLICT DO NOTHING (docs/decisions.md "Delivery path: fewer writes per occurrence")."""
    try:
        with transaction.atomic():
            cursor.execute(_INSERT_NEW_OCCURRENCES, params)
            counts = cursor.fetchone()
    except IntegrityError:
        cursor.execute(_INSERT_OCCURRENCES, params)
        counts = cursor.fetchone()
    assert counts is not None
    return int(counts[0]), int(counts[1])


def _count_batch(result: BatchResult) -> None:
    """Metrics of a committed batch."""
    for lane, count in result.lanes.items():
        metrics.occurrences_materialized.labels(lane=lane).inc(count)
    metrics.occurrence_conflicts.inc(result.conflicts)
    metrics.occurrences_missed.inc(result.missed)


class _BatchWrites:
    """What one batch writes, built as text columns (one array literal per column,
    pipeline/bulk.py): occurrence rows, schedule advances and schedule events."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.occurrences: dict[str, list[str]] = {k: [] for k in _OCCURRENCE_COLUMNS}
        self.advance: dict[str, list[str]] = {k: [] for k in _ADVANCE_COLUMNS}
        self.events: list[ScheduleEvent] = []
        self.text = _TextCache()
        self.result = BatchResult()

    def add(self, row: _Row, plan: _Plan) -> None:
        schedule_id, version = str(row.id), str(row.version)
        self._add_occurrences(row, plan, schedule_id, version)
        state = Schedule.State.ACTIVE if plan.next_run_at else Schedule.State.COMPLETED
        advance = self.advance
        advance["id"].append(schedule_id)
        advance["version"].append(version)
        advance["old"].append(self.text.instant(row.next_run_at))
        advance["next"].append(self.text.instant(plan.next_run_at))
        advance["state"].append(state)
        if plan.missed_total:
            self.result.missed += plan.missed_total
            self.events.append(
                _event(row, ScheduleEvent.Kind.MISSED, self.now, _missed_detail(row, plan))
            )
        if state == Schedule.State.COMPLETED:
            self.result.completed += 1
            self.events.append(_event(row, ScheduleEvent.Kind.COMPLETED, self.now, {}))

    def _add_occurrences(self, row: _Row, plan: _Plan, schedule_id: str, version: str) -> None:
        cols, text, lanes = self.occurrences, self.text, self.result.lanes
        tenant_id, shard = str(row.tenant_id), str(row.shard)
        scheduled = Occurrence.State.SCHEDULED
        for instant, lane, state in plan.occurrences:
            occ_id = occurrence_id_for(row.id, row.version, instant)
            available = (
                flexible_available_at(occ_id, instant, row.flexible_window_s)
                if lane == Lane.FLEXIBLE
                else instant
            )
            cols["id"].append(str(occ_id))
            cols["at"].append(text.instant(instant))
            cols["schedule"].append(schedule_id)
            cols["version"].append(version)
            cols["tenant"].append(tenant_id)
            cols["lane"].append(lane)
            cols["state"].append(state)
            cols["available"].append(text.instant(available))
            cols["shard"].append(shard)
            if state == scheduled:
                lanes[lane] += 1


class _TextCache:
    """ISO text of instants, formatted once per distinct instant in a batch."""

    def __init__(self) -> None:
        self._text: dict[datetime | None, str] = {None: "NULL"}

    def instant(self, value: datetime | None) -> str:
        found = self._text.get(value)
        if found is None:
            found = self._text[value] = value.astimezone(UTC).isoformat()  # type: ignore[union-attr]
        return found

    def days(self) -> set[date]:
        return {value.astimezone(UTC).date() for value in self._text if value is not None}


def _missed_detail(row: _Row, plan: _Plan) -> dict[str, Any]:
    """A `missed` event's detail; the audit reads `count_exact`, `first_pending` and
    `recorded` (older instants than the recorded ones were counted, not stored)."""
    return {
        "policy": row.misfire_policy,
        "recorded": [m.isoformat() for m in plan.missed],
        "missed_count": plan.missed_total,
        "count_exact": plan.missed_exact,
        "first_pending": row.next_run_at.isoformat(),
    }


def _event(row: _Row, kind: str, now: datetime, detail: dict[str, Any]) -> ScheduleEvent:
    return ScheduleEvent(
        schedule_id=row.id,
        tenant_id=row.tenant_id,
        kind=kind,
        version=row.version,
        actor=ShardLease.Role.MATERIALIZER,
        at=now,
        detail=detail,
    )


def materialize_pass(
    *,
    leases: LeaseSet,
    now: datetime,
    config: MaterializeConfig,
    budget_s: float | None = None,
) -> BatchResult:
    """Run batches until the held shards have nothing due inside the planning window, or
    until `budget_s` has passed: the caller's loop then refreshes the leases (a process
    that has just joined gets its share of a 500k burst) and calls again with a new `now`."""
    partitions_ensure({now.date(), config.horizons(now)[1].date()})
    total = BatchResult()
    started = time.monotonic()
    while True:
        elapsed = timedelta(seconds=time.monotonic() - started)
        batch = materialize_batch(leases=leases, now=now, config=config, elapsed=elapsed)
        total += batch
        if batch.schedules < config.batch_size:
            return total
        if budget_s is not None and time.monotonic() - started >= budget_s:
            return total


# ---------------------------------------------------------------------------------------------
# An update's boundary (docs/decisions.md "Lifecycle API", "An update commits a boundary")
# ---------------------------------------------------------------------------------------------

# Which of the given days have an occurrence partition: instants on a day without one (dropped
# by retention, never created) are counted in the `missed` event instead of stored. A catalog
# probe, no DDL: this runs inside a lifecycle transaction.
_DAYS_WITH_PARTITION = """
    SELECT p.day FROM unnest(%(days)s::date[], %(names)s::text[]) AS p(day, name)
    WHERE to_regclass(p.name) IS NOT NULL
"""


def old_version_until_boundary(
    *, schedule: Schedule, boundary: datetime, now: datetime, config: MaterializeConfig, actor: str
) -> int:
    """Produce the instants of `schedule`'s current version in [next_run_at, boundary) that no
    batch materialized - the materializer was behind when an update closed the version at
    `boundary` - exactly as a batch at `now` would have: the materializer's own plan
    (`_plan`, horizon just before the boundary) fires the ones within `max_lateness_s` and,
    older than that, what the misfire policy fires (FIRE_ONCE the latest, CATCHUP up to its
    limit); the rest are MISSED (the latest `missed_record_limit` as rows, all counted in one
    `missed` event). Fired ones are old-version occurrences with an outbox row: the claim runs
    them as any in-flight occurrence of a closed version (claim.py, step a).

    Runs in the caller's transaction, on the schedule row it locked FOR UPDATE (a batch
    holding the row committed first, so `next_run_at` is the true frontier). Instants on a day
    whose partition is gone are counted MISSED, not stored (no DDL inside an update). Returns
    the number of instants recorded or counted MISSED.
    """
    next_run_at = schedule.next_run_at
    if schedule.state != Schedule.State.ACTIVE or next_run_at is None or next_run_at >= boundary:
        return 0
    row = _Row(
        schedule.id, schedule.tenant_id, schedule.kind, schedule.expression, schedule.time_zone,
        schedule.dst_gap, schedule.dst_fold, schedule.version, next_run_at, schedule.precision,
        schedule.flexible_window_s, schedule.misfire_policy, schedule.max_lateness_s,
        schedule.catchup_limit, schedule.end_at, schedule.shard, schedule.interval_s,
        schedule.start_at,
    )  # fmt: skip
    plan = _plan(row, now, boundary - ONE_MICROSECOND, config)
    instants = [instant for instant, _ in plan.fire] + plan.missed
    if not instants:
        return 0
    with connection.cursor() as cursor:
        days = sorted({t.astimezone(UTC).date() for t in instants})
        names = [partition_name(Occurrence._meta.db_table, day) for day in days]
        cursor.execute(_DAYS_WITH_PARTITION, {"days": days, "names": names})
        stored_days = {found[0] for found in cursor.fetchall()}
        fire = [(t, lane) for t, lane in plan.fire if t.astimezone(UTC).date() in stored_days]
        recorded = [t for t in plan.missed if t.astimezone(UTC).date() in stored_days]
        unstored = len(plan.fire) - len(fire)
        plan = _Plan(
            fire=fire, missed=recorded, missed_total=plan.missed_total + unstored,
            # "exact" promises the audit a row for every counted instant.
            missed_exact=plan.missed_exact and len(recorded) == len(plan.missed) and not unstored,
            next_run_at=boundary,
        )  # fmt: skip
        writes = _BatchWrites(now)
        writes._add_occurrences(row, plan, str(row.id), str(row.version))
        if plan.occurrences:
            cursor.execute(_INSERT_OCCURRENCES, {
                **{k: array_literal(writes.occurrences[k]) for k in _OCCURRENCE_COLUMNS},
                "now": now,
                "missed_state": Occurrence.State.MISSED,
                "scheduled_state": Occurrence.State.SCHEDULED,
            })  # fmt: skip
    total = plan.missed_total
    if total:
        detail = {**_missed_detail(row, plan), "boundary": boundary.isoformat()}
        event = ScheduleEvent.objects.create(
            schedule_id=row.id, tenant_id=row.tenant_id, kind=ScheduleEvent.Kind.MISSED,
            version=row.version, actor=actor, at=now, detail=detail,
        )  # fmt: skip
        with connection.cursor() as cursor:
            record_schedule_event_alerts(cursor, [event])
        transaction.on_commit(lambda: metrics.occurrences_missed.inc(total))
    return total
