"""The reconciliation audit: prove that no due occurrence went silently missing or stuck.

For every schedule version, the audit recomputes the instants the version should have
produced inside `[from, to)` and compares them with the stored occurrences. The expected
instants come from an **independent code path**: `cron_matcher.py`, the second cron
evaluator, which walks the local wall clock minute by minute and decides DST by reading the
clock back through `zoneinfo`. Neither `materializer.py` (`_plan`, `_fires`, `_latest_before`)
nor `timerules` is called, so a bug in either cannot hide itself here.

Chunk by chunk (bounded memory: one chunk of `chunk_size` schedules with their versions,
events, occurrences and outbox ids at a time), each chunk read in one REPEATABLE READ
snapshot so a relay or materializer committing meanwhile cannot fake a stranded row:
1. Load the next chunk of schedules by primary-key keyset (with --tenant: by the tenant
   listing index), their versions and lifecycle events (paused / resumed / missed /
   canceled). Chunks follow the primary key rather than the shard number because no index
   leads with `shard` for non-ACTIVE schedules: a per-shard read would scan the table 256 times.
2. Load the stored occurrences of those schedules in `[from, to)` and their outbox ids.
3. Per version: expected = rule instants t with valid_from < t < valid_to, start_at <= t <
   end_at, t < the schedule's `next_run_at` when this is the current version of an ACTIVE
   schedule (later instants are "beyond_frontier": not materialized yet, which is fine while
   `next_run_at` keeps up - step 5 fails the audit when it does not).
4. Classify each expected instant by the state of its stored row, or - when no row exists -
   as paused (inside a pause), missed_summarised (covered by a `missed` event whose count was
   not exact), or **missing**. Rows nobody expected are **unexpected**; a SCHEDULED or
   RETRY_WAIT row without its outbox row is **stranded** (it can never be published).
5. Once, after the chunks, in one snapshot: work that sits in a pending state past a bound
   (`StuckBounds`) - **stuck_enqueued**, **stuck_scheduled**, **stuck_running** - and ACTIVE
   schedules whose `next_run_at` lags behind now (**unmaterialized**). A row in the right
   state is not proof that it will ever move on. Set-based queries, each a count plus a
   LIMITed sample, restricted to `[from, to)` on the partition key where they read
   occurrences, and to `schedule_due_idx` where they read schedules.

6. Once, set-based: runs that broke their schedule's misfire policy (misfire.py). A *late
   run* is a first attempt of a scheduled instant in `[from, to)` that started more than
   `max_lateness_s` (+ POLICY_SLACK) after it came due, or that runs in the catch-up lane.
   It broke the policy when, at its start, the schedule already had at least as many later
   late instants (MISSED, or run late) as the policy lets run: any under SKIP
   (**late_run_skip**), one under FIRE_ONCE (**late_runs_fire_once**), `catchup_limit`
   under CATCHUP (**late_runs_catchup**). Instants only counted in a `missed` event (no row)
   are not seen: the check can under-count, never invent a breach.
   The other way round, an instant given up though the policy let it run: a MISSED instant
   of a FIRE_ONCE or CATCHUP schedule with fewer later late instants (MISSED, in the
   catch-up lane, or still open and late) than the policy lets run (**late_runs_too_few**).
   Judged only where the count is complete: an instant of the schedule's current version, the
   schedule ACTIVE with its materializer frontier past the lateness cutoff, and no later
   instant CANCELED or SUPERSEDED.

The rules, and why each is sound, are written down in docs/operations.md ("Reconciliation").
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.core.config import SettingsConfig, setting
from apps.occurrences.audit import cron_matcher
from apps.occurrences.models import OCCURRENCE_NAMESPACE, Lane, Occurrence
from apps.schedules.models import Schedule, ScheduleEvent

STUCK = ("stuck_enqueued", "stuck_scheduled", "stuck_running", "unmaterialized")
# Runs that broke their schedule's misfire policy (step 6).
POLICY_BREACHES = (
    "late_run_skip",
    "late_runs_fire_once",
    "late_runs_catchup",
    "late_runs_too_few",
)
FAILING = ("missing", "unexpected", "stranded", *STUCK, *POLICY_BREACHES)
SAMPLE_LIMIT = 20

_STATE_CLASS: dict[str, str] = {
    Occurrence.State.SUCCEEDED: "succeeded",
    Occurrence.State.DEAD: "dead",
    Occurrence.State.CANCELED: "canceled",
    Occurrence.State.SUPERSEDED: "superseded",
    Occurrence.State.MISSED: "missed",
    Occurrence.State.SKIPPED_OVERLAP: "skipped",
    Occurrence.State.SCHEDULED: "pending",
    Occurrence.State.ENQUEUED: "pending",
    Occurrence.State.RUNNING: "pending",
    Occurrence.State.RETRY_WAIT: "pending",
    Occurrence.State.WAITING: "pending",
}
_NEEDS_OUTBOX = (Occurrence.State.SCHEDULED, Occurrence.State.RETRY_WAIT)
# Stored outside the version's interval (or inside a pause) and still fine: the lifecycle
# invalidated rows that had been materialized ahead of the change.
_INVALIDATED = (Occurrence.State.SUPERSEDED, Occurrence.State.CANCELED)
# The states in which next_run_at is the materializer's frontier for the current version.
_FRONTIER_STATES = (Schedule.State.ACTIVE, Schedule.State.PAUSED)
# The lifecycle events that tell where instants may rightly have no row.
_LIFECYCLE_KINDS = [
    str(kind)
    for kind in (
        ScheduleEvent.Kind.PAUSED,
        ScheduleEvent.Kind.RESUMED,
        ScheduleEvent.Kind.MISSED,
        ScheduleEvent.Kind.CANCELED,
    )
]
_ONE_MICROSECOND = timedelta(microseconds=1)


@dataclass
class Finding:
    kind: str
    schedule_id: str
    version: int
    scheduled_for: str  # unmaterialized: the schedule's next_run_at
    occurrence_id: str | None = None
    state: str | None = None
    # Stuck classes: seconds since the row should have moved on (enqueued_at, the due outbox
    # instant, the lease's expiry) or, for unmaterialized, the materialization lag.
    age_s: float | None = None


class StuckBounds(SettingsConfig):
    """Seconds a row may sit in a pending state (or next_run_at may lag) before it fails."""

    enqueued_s: int = setting("TICK_AUDIT_ENQUEUED_BOUND_S")
    scheduled_s: int = setting("TICK_AUDIT_SCHEDULED_BOUND_S")
    running_s: int = setting("TICK_AUDIT_RUNNING_BOUND_S")
    materialize_lag_s: int = setting("TICK_AUDIT_MATERIALIZE_LAG_S")


@dataclass
class ReconcileReport:
    start: datetime
    end: datetime
    counts: Counter[str] = field(default_factory=Counter)
    samples: dict[str, list[Finding]] = field(default_factory=lambda: defaultdict(list))
    schedules: int = 0
    versions: int = 0
    stored: int = 0
    chunks: int = 0
    elapsed_s: float = 0.0
    now: datetime | None = None
    bounds: StuckBounds | None = None

    @property
    def failed(self) -> bool:
        return any(self.counts[k] for k in FAILING)

    def add(self, finding: Finding) -> None:
        self.counts[finding.kind] += 1
        bucket = self.samples[finding.kind]
        if finding.kind in FAILING and len(bucket) < SAMPLE_LIMIT:
            bucket.append(finding)

    def as_json(self) -> dict[str, Any]:
        rate = self.schedules / self.elapsed_s if self.elapsed_s else 0.0
        # Failing classes always appear, zero included: a 0 says the check ran.
        counts = {**dict.fromkeys(FAILING, 0), **self.counts}
        return {
            "from": self.start.isoformat(),
            "to": self.end.isoformat(),
            "now": self.now.isoformat() if self.now else None,
            "ok": not self.failed,
            "counts": dict(sorted(counts.items())),
            "samples": {k: [vars(f) for f in v] for k, v in sorted(self.samples.items()) if v},
            "schedules": self.schedules,
            "versions": self.versions,
            "stored_occurrences": self.stored,
            "chunks": self.chunks,
            "elapsed_s": round(self.elapsed_s, 3),
            "schedules_per_s": round(rate, 1),
            "stuck_bounds_s": asdict(self.bounds) if self.bounds else None,
        }


@dataclass
class _Version:
    version: int
    definition: dict[str, Any]
    valid_from: datetime
    valid_to: datetime | None


@dataclass
class _Schedule:
    id: uuid.UUID
    state: str
    version: int
    next_run_at: datetime | None
    versions: list[_Version] = field(default_factory=list)
    pauses: list[tuple[datetime, datetime | None]] = field(default_factory=list)
    summarised: dict[int, list[tuple[datetime, datetime]]] = field(default_factory=dict)


def _dt(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


@functools.lru_cache(maxsize=2048)
def expected_cron_instants(
    expression: str, time_zone: str, dst_gap: str, dst_fold: str, lo: datetime, hi: datetime
) -> tuple[datetime, ...]:
    """Every instant in [lo, hi) (aware UTC) at which the rule fires, ascending, from the
    independent matcher; memoised because thousands of schedules share a rule and a window."""
    return cron_matcher.fire_times(
        expression, time_zone, lo, hi, dst_gap=dst_gap, dst_fold=dst_fold
    )


def expected_interval_instants(
    interval_s: int, anchor: datetime, lo: datetime, hi: datetime
) -> tuple[datetime, ...]:
    """Every instant anchor + k * interval_s (k >= 0) in [lo, hi), aware UTC: counted in whole
    microseconds since the epoch, not with `timerules`' timedelta steps, so the audit's
    answer is its own."""
    epoch = datetime(1970, 1, 1, tzinfo=UTC)

    def micros(value: datetime) -> int:
        delta = value - epoch
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds

    step, origin = interval_s * 1_000_000, micros(anchor)
    first = max(0, -(-(micros(lo) - origin) // step))  # ceiling division
    out: list[datetime] = []
    at = origin + first * step
    end = micros(hi)
    while at < end:
        out.append(epoch + timedelta(microseconds=at))
        at += step
    return tuple(out)


def _rule_instants(defn: dict[str, Any], lo: datetime, hi: datetime) -> tuple[datetime, ...]:
    if lo >= hi:
        return ()
    if defn["kind"] == Schedule.Kind.ONE_SHOT:
        run_at = _dt(defn.get("run_at"))
        return (run_at,) if run_at is not None and lo <= run_at < hi else ()
    if defn["kind"] == Schedule.Kind.INTERVAL:
        anchor = _dt(defn.get("start_at"))
        assert anchor is not None, "a fixed-rate version records its anchor"
        return expected_interval_instants(int(defn["interval_s"]), anchor, lo, hi)
    return expected_cron_instants(
        defn["expression"],
        defn.get("time_zone") or "UTC",
        defn.get("dst_gap") or Schedule.DstGap.SKIP,
        defn.get("dst_fold") or Schedule.DstFold.FIRST,
        lo,
        hi,
    )


_SCHEDULES_SQL = """
    SELECT id, state, version, next_run_at, created_at FROM schedules_schedule
    WHERE id > %s ORDER BY id LIMIT %s
"""
# Through schedule_tenant_list_idx (tenant, -created_at, -id).
_TENANT_SCHEDULES_SQL = """
    SELECT id, state, version, next_run_at, created_at FROM schedules_schedule
    WHERE tenant_id = %s AND (created_at, id) < (%s, %s)
    ORDER BY created_at DESC, id DESC LIMIT %s
"""
_VERSIONS_SQL = """
    SELECT schedule_id, version, definition, valid_from, valid_to FROM schedules_scheduleversion
    WHERE schedule_id = ANY(%s::uuid[])
    ORDER BY schedule_id, version
"""
_EVENTS_SQL = """
    SELECT schedule_id, kind, version, at, detail FROM schedules_scheduleevent
    WHERE schedule_id = ANY(%s::uuid[]) AND kind = ANY(%s)
    ORDER BY schedule_id, at, id
"""
# Through occurrence_instant_origin_uniq (schedule_id, schedule_version, scheduled_for,
# origin). Only the timetable's own occurrences: a run-now or backfill run is asked for, not
# expected from the rule (its stuck states are still judged in step 5).
_OCCURRENCES_SQL = """
    SELECT uuid_send(id), uuid_send(schedule_id), schedule_version,
           (extract(epoch FROM scheduled_for) * 1000000)::bigint, state
    FROM occurrences_occurrence
    WHERE schedule_id = ANY(%s::uuid[]) AND scheduled_for >= %s AND scheduled_for < %s
      AND origin = %s
"""
_OUTBOX_SQL = """
    SELECT uuid_send(occurrence_id) FROM occurrences_dispatchoutbox
    WHERE schedule_id = ANY(%s::uuid[])
"""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Rows arrive as (id bytes, schedule id bytes, version, epoch µs, state): decoding uuids and
# timestamptz text cost most of the audit's time; instants repeat across schedules, so each
# distinct one becomes a datetime once.
_INSTANTS: dict[int, datetime] = {}


def _instant(micros: int) -> datetime:
    found = _INSTANTS.get(micros)
    if found is None:
        if len(_INSTANTS) > 200_000:
            _INSTANTS.clear()
        found = _INSTANTS[micros] = _EPOCH + timedelta(microseconds=micros)
    return found


_MAX_UUID = uuid.UUID(int=(1 << 128) - 1)
_FAR_FUTURE = datetime(9999, 1, 1, tzinfo=UTC)


def reconcile(
    *,
    start: datetime,
    end: datetime,
    tenant_id: uuid.UUID | None = None,
    chunk_size: int = 5000,
    now: datetime | None = None,
    bounds: StuckBounds | None = None,
) -> ReconcileReport:
    """Audit `[start, end)` chunk by chunk (module docstring, steps 1-4), then look for
    stuck work and a lagging materializer as of `now` (step 5)."""
    report = ReconcileReport(
        start=start,
        end=end,
        now=now or timezone.now(),
        bounds=bounds or StuckBounds.from_settings(),
    )
    started = time.perf_counter()
    cursor_key: tuple[Any, ...] = (_FAR_FUTURE, _MAX_UUID) if tenant_id else (uuid.UUID(int=0),)
    # Inside a caller's transaction (tests) the caller's snapshot rules instead.
    own_snapshot = not connection.in_atomic_block
    while True:
        with transaction.atomic():
            with connection.cursor() as cursor:
                if own_snapshot:
                    cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                if tenant_id is not None:
                    cursor.execute(_TENANT_SCHEDULES_SQL, [tenant_id, *cursor_key, chunk_size])
                else:
                    cursor.execute(_SCHEDULES_SQL, [*cursor_key, chunk_size])
                rows = cursor.fetchall()
            if not rows:
                break
            last = rows[-1]
            cursor_key = (last[4], last[0]) if tenant_id else (last[0],)
            schedules, stored, outboxed = _load(rows, start, end)
        report.chunks += 1
        report.schedules += len(schedules)
        for schedule in schedules.values():
            _reconcile_schedule(
                report, schedule, stored.get(schedule.id.bytes, []), outboxed, start, end
            )
        if len(rows) < chunk_size:
            break
    _audit_stuck(report, tenant_id=tenant_id, own_snapshot=own_snapshot)
    _audit_misfire(report, tenant_id=tenant_id)
    report.elapsed_s = time.perf_counter() - started
    return report


def _load(
    rows: list[tuple[Any, ...]], start: datetime, end: datetime
) -> tuple[dict[uuid.UUID, _Schedule], dict[bytes, list[tuple[Any, ...]]], set[bytes]]:
    schedules = {
        row[0]: _Schedule(id=row[0], state=row[1], version=row[2], next_run_at=row[3])
        for row in rows
    }
    # One text literal instead of psycopg adapting 5,000 UUID objects one by one.
    ids = "{" + ",".join(str(sid) for sid in schedules) + "}"
    with connection.cursor() as cursor:
        cursor.execute(_VERSIONS_SQL, [ids])
        for sid, version, definition, valid_from, valid_to in cursor.fetchall():
            if isinstance(definition, str):
                definition = json.loads(definition)
            schedules[sid].versions.append(_Version(version, definition, valid_from, valid_to))
        cursor.execute(_EVENTS_SQL, [ids, _LIFECYCLE_KINDS])
        for sid, kind, version, at, detail in cursor.fetchall():
            if isinstance(detail, str):
                detail = json.loads(detail)
            _apply_event(schedules[sid], kind, version, at, detail)
        cursor.execute(_OCCURRENCES_SQL, [ids, start, end, Occurrence.Origin.SCHEDULED])
        stored: dict[bytes, list[tuple[Any, ...]]] = defaultdict(list)
        for occ_id, sid, version, micros, state in cursor.fetchall():
            stored[bytes(sid)].append((bytes(occ_id), version, _instant(micros), state))
        cursor.execute(_OUTBOX_SQL, [ids])
        outboxed = {bytes(row[0]) for row in cursor.fetchall()}
    return schedules, stored, outboxed


def _apply_event(schedule: _Schedule, kind: str, version: int, at: datetime, detail: Any) -> None:
    if kind == ScheduleEvent.Kind.PAUSED:
        schedule.pauses.append((at, None))
    elif kind in (ScheduleEvent.Kind.RESUMED, ScheduleEvent.Kind.CANCELED):
        if schedule.pauses and schedule.pauses[-1][1] is None:
            schedule.pauses[-1] = (schedule.pauses[-1][0], at)
    elif (
        kind == ScheduleEvent.Kind.MISSED
        and isinstance(detail, dict)
        and not detail.get("count_exact", True)
    ):
        # Rows exist for the latest recorded instants only; the older ones of
        # [first_pending, earliest recorded) were counted, not stored.
        first = _dt(detail.get("first_pending"))
        recorded = [_dt(r) for r in detail.get("recorded") or []]
        upto = min((r for r in recorded if r is not None), default=at)
        if first is not None:
            schedule.summarised.setdefault(version, []).append((first, upto))


def _inside(spans: Sequence[tuple[datetime, datetime | None]], t: datetime) -> bool:
    return any(a <= t and (b is None or t < b) for a, b in spans)


def _reconcile_schedule(
    report: ReconcileReport,
    schedule: _Schedule,
    rows: list[tuple[Any, ...]],
    outboxed: set[bytes],
    start: datetime,
    end: datetime,
) -> None:
    """Steps 3 and 4 for one schedule, version by version."""
    report.stored += len(rows)
    by_version: dict[int, dict[datetime, tuple[Any, ...]]] = defaultdict(dict)
    for row in rows:
        by_version[row[1]][row[2]] = row
    sid = str(schedule.id)
    # The latest instant an older version produced and kept: a new version starts after it.
    kept_floor: datetime | None = None
    seen_versions: set[int] = set()
    for ver in schedule.versions:
        report.versions += 1
        seen_versions.add(ver.version)
        mine = by_version.get(ver.version, {})
        lo, hi = _version_window(ver, kept_floor, start, end)
        expected = _rule_instants(ver.definition, lo, hi)
        _classify_expected(report, schedule, ver, mine, expected, outboxed)
        if mine:
            _classify_unexpected(report, schedule, ver, mine, outboxed, start, end)
        kept = [t for t, _ in _kept_rows(rows, ver.version)]
        if kept:
            top = max(kept)
            kept_floor = top if kept_floor is None else max(kept_floor, top)
    for version, remaining in by_version.items():
        if version not in seen_versions:
            for row in remaining.values():
                _unexpected(report, sid, row)


def _version_window(
    ver: _Version, kept_floor: datetime | None, start: datetime, end: datetime
) -> tuple[datetime, datetime]:
    """[lo, hi) in which the version owes instants: inside the audit window, after it became
    valid and after what an older version kept, within its start_at / end_at, before valid_to."""
    defn = ver.definition
    lo = max(start, ver.valid_from + _ONE_MICROSECOND)
    if kept_floor is not None:
        lo = max(lo, kept_floor + _ONE_MICROSECOND)
    start_at = _dt(defn.get("start_at"))
    if start_at is not None:
        lo = max(lo, start_at)
    hi = end
    for bound in (ver.valid_to, _dt(defn.get("end_at"))):
        if bound is not None:
            hi = min(hi, bound)
    return lo, hi


def _classify_expected(
    report: ReconcileReport,
    schedule: _Schedule,
    ver: _Version,
    mine: dict[datetime, tuple[Any, ...]],
    expected: tuple[datetime, ...],
    outboxed: set[bytes],
) -> None:
    """Step 4 for the expected instants: by the state of the stored row (taken out of `mine`),
    or, without one, by why it may rightly be absent - else missing."""
    sid = str(schedule.id)
    frontier: datetime | None = None
    if ver.version == schedule.version and schedule.state in _FRONTIER_STATES:
        frontier = schedule.next_run_at
    summarised = schedule.summarised.get(ver.version, [])
    for t in expected:
        found = mine.pop(t) if t in mine else None
        if found is not None:
            _classify_stored(report, sid, found, outboxed)
        elif frontier is not None and t >= frontier:
            report.counts["beyond_frontier"] += 1
        elif _inside(schedule.pauses, t):
            report.counts["paused"] += 1
        elif _inside(summarised, t):
            report.counts["missed_summarised"] += 1
        else:
            report.add(Finding("missing", sid, ver.version, t.isoformat()))


def _classify_unexpected(
    report: ReconcileReport,
    schedule: _Schedule,
    ver: _Version,
    mine: dict[datetime, tuple[Any, ...]],
    outboxed: set[bytes],
    start: datetime,
    end: datetime,
) -> None:
    """Step 4 for the version's rows outside the expected set: fine only if the lifecycle
    invalidated them and they lie on the version's own rule (materialized ahead of an update,
    pause or cancel), or they are inside a pause."""
    sid = str(schedule.id)
    on_rule = set(_rule_instants(ver.definition, start, end))
    for t, row in sorted(mine.items()):
        if t in on_rule and (row[3] in _INVALIDATED or _inside(schedule.pauses, t)):
            _classify_stored(report, sid, row, outboxed)
        else:
            _unexpected(report, sid, row)


def _kept_rows(rows: list[tuple[Any, ...]], version: int) -> Iterator[tuple[datetime, Any]]:
    for row in rows:
        if row[1] == version and row[3] not in _INVALIDATED:
            yield row[2], row


def _classify_stored(
    report: ReconcileReport, sid: str, row: tuple[Any, ...], outboxed: set[bytes]
) -> None:
    occ_id, version, at, state = row
    if occ_id != expected_id_bytes(sid, version, at):
        _unexpected(report, sid, row)
        return
    if state in _NEEDS_OUTBOX and occ_id not in outboxed:
        report.add(Finding("stranded", sid, version, at.isoformat(), _text(occ_id), state))
        return
    report.counts[_STATE_CLASS.get(state, "pending")] += 1


# --------------------------------------------------------------------------------------------
# Stuck work (step 5)
# --------------------------------------------------------------------------------------------
# Every query returns (id, schedule id, version, instant, state, since, total): the oldest
# SAMPLE_LIMIT rows, each carrying the count of all matches (count(*) OVER () runs before
# the LIMIT): one read per class.
# There is no index on occurrences.state: the occurrence queries are bounded by the audit
# window on the partition key, i.e. they scan the window's day partitions.

# Timed from the latest broker confirm (last_enqueued_at: a retry, a quota delay or a backstop
# republish is confirmed again; enqueued_at stays the first). An attempt open or ended within
# the bound also means the row has been back in the queue only since then. Through
# attempt_no_uniq (occurrence_id, scheduled_for, attempt_no), pruned to the window.
_STUCK_ENQUEUED_SQL = """
    SELECT o.id, o.schedule_id, o.schedule_version, o.scheduled_for, o.state,
           COALESCE(o.last_enqueued_at, o.enqueued_at) AS since, count(*) OVER ()
    FROM occurrences_occurrence o
    WHERE o.scheduled_for >= %(start)s AND o.scheduled_for < %(end)s
      AND o.state = %(enqueued)s
      AND COALESCE(o.last_enqueued_at, o.enqueued_at) < %(enqueued_before)s {tenant}
      AND NOT EXISTS (
          SELECT 1 FROM occurrences_attempt a
          WHERE a.occurrence_id = o.id AND a.scheduled_for = o.scheduled_for
            AND a.scheduled_for >= %(start)s AND a.scheduled_for < %(end)s
            AND (a.finished_at IS NULL OR a.finished_at >= %(enqueued_before)s)
      )
    ORDER BY since, o.id
    LIMIT %(limit)s
"""
# Due more than the bound ago and not published: the earliest unparked outbox row is past due
# (a failing publish backs its row off, so a relay still trying is not stuck), or there is no
# such row at all. A RETRY_WAIT row's own available_at is its first due instant, before any
# retry, so the outbox row is what tells when its retry is due. The outbox has no index on
# occurrence_id: the join reads it once (it holds only unpublished rows).
_STUCK_SCHEDULED_SQL = """
    SELECT o.id, o.schedule_id, o.schedule_version, o.scheduled_for, o.state,
           coalesce(min(b.available_at), o.available_at) AS since, count(*) OVER ()
    FROM occurrences_occurrence o
    LEFT JOIN occurrences_dispatchoutbox b
        ON b.occurrence_id = o.id AND b.scheduled_for = o.scheduled_for
       AND b.parked_at IS NULL
    WHERE o.scheduled_for >= %(start)s AND o.scheduled_for < %(end)s
      AND o.state IN (%(scheduled)s, %(retry_wait)s)
      AND o.available_at < %(scheduled_before)s {tenant}
    GROUP BY o.id, o.scheduled_for
    HAVING coalesce(min(b.available_at), o.available_at) < %(scheduled_before)s
    ORDER BY since, o.id
    LIMIT %(limit)s
"""
# The reaper takes an attempt within seconds of its lease's expiry; one this far past it means
# the reaper is down. Through a partial index of open attempts (attempt_open_lease_idx or
# attempt_open_tenant_idx: finished attempts are not in them), then the occurrence by key.
_STUCK_RUNNING_SQL = """
    SELECT o.id, o.schedule_id, o.schedule_version, o.scheduled_for, o.state,
           a.lease_expires_at AS since, count(*) OVER ()
    FROM occurrences_attempt a
    JOIN occurrences_occurrence o
        ON o.id = a.occurrence_id AND o.scheduled_for = a.scheduled_for
    WHERE a.finished_at IS NULL AND a.lease_expires_at < %(running_before)s
      AND a.scheduled_for >= %(start)s AND a.scheduled_for < %(end)s
      AND o.scheduled_for >= %(start)s AND o.scheduled_for < %(end)s
      AND o.state = %(running)s {tenant}
    ORDER BY since, o.id
    LIMIT %(limit)s
"""
# Schedules are not bounded by the window: a materializer down for a day leaves next_run_at
# before any recent window. One range probe of schedule_due_idx per shard instead (its
# partial predicate is repeated so that it applies); healthy, each probe finds nothing.
# The count reads the index alone; the sample takes at most SAMPLE_LIMIT rows per shard.
_LATE_SCHEDULES = """
    FROM generate_series(0, %(shards)s - 1) AS g(shard)
    CROSS JOIN LATERAL (
        SELECT s.id, s.version, s.next_run_at, s.state FROM schedules_schedule s
        WHERE s.shard = g.shard AND s.state = %(active)s AND s.next_run_at IS NOT NULL
          AND s.next_run_at < %(materialize_before)s {tenant}
        {order_limit}
    ) AS late
"""
_LATE_COUNT_SQL = "SELECT count(*)" + _LATE_SCHEDULES
_LATE_SAMPLE_SQL = (
    "SELECT late.id, late.version, late.next_run_at, late.state"
    + _LATE_SCHEDULES
    + " ORDER BY late.next_run_at, late.id LIMIT %(limit)s"
)


def _audit_stuck(
    report: ReconcileReport, *, tenant_id: uuid.UUID | None, own_snapshot: bool
) -> None:
    """Step 5: the four stuck classes as of `report.now`, in one snapshot."""
    assert report.now is not None and report.bounds is not None
    now, bounds = report.now, report.bounds
    params: dict[str, Any] = {
        "start": report.start,
        "end": report.end,
        "tenant": tenant_id,
        "limit": SAMPLE_LIMIT,
        "shards": settings.TICK_SHARDS,
        "enqueued": Occurrence.State.ENQUEUED,
        "scheduled": Occurrence.State.SCHEDULED,
        "retry_wait": Occurrence.State.RETRY_WAIT,
        "running": Occurrence.State.RUNNING,
        "active": Schedule.State.ACTIVE,
        "enqueued_before": now - timedelta(seconds=bounds.enqueued_s),
        "scheduled_before": now - timedelta(seconds=bounds.scheduled_s),
        "running_before": now - timedelta(seconds=bounds.running_s),
        "materialize_before": now - timedelta(seconds=bounds.materialize_lag_s),
    }
    by_tenant = tenant_id is not None
    occurrence_tenant = "AND o.tenant_id = %(tenant)s" if by_tenant else ""
    schedule_tenant = "AND s.tenant_id = %(tenant)s" if by_tenant else ""
    with transaction.atomic(), connection.cursor() as cursor:
        if own_snapshot:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        for kind, sql in (
            ("stuck_enqueued", _STUCK_ENQUEUED_SQL),
            ("stuck_scheduled", _STUCK_SCHEDULED_SQL),
            ("stuck_running", _STUCK_RUNNING_SQL),
        ):
            cursor.execute(sql.format(tenant=occurrence_tenant), params)
            rows = cursor.fetchall()
            if rows:
                report.counts[kind] = int(rows[0][6])
                report.samples[kind] = [
                    Finding(kind, str(sid), version, at.isoformat(), str(occ_id), state,
                            _age(now, since))
                    for occ_id, sid, version, at, state, since, _ in rows
                ]  # fmt: skip
        cursor.execute(_LATE_COUNT_SQL.format(tenant=schedule_tenant, order_limit=""), params)
        late = cursor.fetchone()
        if late and late[0]:
            report.counts["unmaterialized"] = int(late[0])
            per_shard = "ORDER BY s.next_run_at LIMIT %(limit)s"
            cursor.execute(
                _LATE_SAMPLE_SQL.format(tenant=schedule_tenant, order_limit=per_shard), params
            )
            report.samples["unmaterialized"] = [
                Finding("unmaterialized", str(sid), version, next_run_at.isoformat(),
                        state=state, age_s=_age(now, next_run_at))
                for sid, version, next_run_at, state in cursor.fetchall()
            ]  # fmt: skip


def _age(now: datetime, since: datetime) -> float:
    return round((now - since).total_seconds(), 1)


_NAMESPACE_BYTES = OCCURRENCE_NAMESPACE.bytes
_INSTANT_TEXT: dict[datetime, str] = {}


def expected_id_bytes(schedule_id: str, version: int, at: datetime) -> bytes:
    """The occurrence id the contract prescribes (UUIDv5 over "schedule:version:UTC instant"),
    recomputed with hashlib: the same value as `occurrence_id_for`, at a third of its cost."""
    text = _INSTANT_TEXT.get(at)
    if text is None:
        if len(_INSTANT_TEXT) > 200_000:
            _INSTANT_TEXT.clear()
        text = _INSTANT_TEXT[at] = at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    digest = bytearray(
        hashlib.sha1(  # noqa: S324 - UUIDv5 is defined over SHA-1; not a security use
            _NAMESPACE_BYTES + f"{schedule_id}:{version}:{text}".encode()
        ).digest()[:16]
    )
    digest[6] = (digest[6] & 0x0F) | 0x50
    digest[8] = (digest[8] & 0x3F) | 0x80
    return bytes(digest)


def _unexpected(report: ReconcileReport, sid: str, row: tuple[Any, ...]) -> None:
    occ_id, version, at, state = row
    report.add(Finding("unexpected", sid, version, at.isoformat(), _text(occ_id), state))


def _text(id_bytes: bytes) -> str:
    return str(uuid.UUID(bytes=id_bytes))


# Clock slack of the policy check: a claim's clock and the database's may differ by this.
POLICY_SLACK_S = 2

_POLICY_BREACH_SQL = """
    WITH runs AS (
        SELECT o.id, o.schedule_id, o.schedule_version, o.scheduled_for, s.misfire_policy,
               s.max_lateness_s, a.started_at,
               CASE s.misfire_policy WHEN %(fire_once)s THEN 1
                                     WHEN %(catchup_policy)s THEN s.catchup_limit
                                     ELSE 0 END AS allowed
        FROM occurrences_occurrence o
        JOIN schedules_schedule s ON s.id = o.schedule_id
        JOIN occurrences_attempt a
            ON a.occurrence_id = o.id AND a.scheduled_for = o.scheduled_for AND a.attempt_no = 1
           AND a.scheduled_for >= %(start)s AND a.scheduled_for < %(end)s
        WHERE o.scheduled_for >= %(start)s AND o.scheduled_for < %(end)s
          AND o.origin = %(scheduled_origin)s AND o.attempt_count > 0 {tenant}
          AND (o.lane = %(catchup_lane)s
               OR a.started_at > o.available_at
                                 + make_interval(secs => s.max_lateness_s + %(slack)s))
    )
    SELECT r.id, r.schedule_id, r.schedule_version, r.scheduled_for, r.misfire_policy,
           count(*) OVER (PARTITION BY r.misfire_policy)
    FROM runs r
    WHERE r.allowed <= (
        SELECT count(*) FROM (
            SELECT 1 FROM occurrences_occurrence y
            WHERE y.schedule_id = r.schedule_id AND y.scheduled_for > r.scheduled_for
              AND y.scheduled_for < r.started_at AND y.origin = %(scheduled_origin)s
              AND y.available_at + make_interval(secs => r.max_lateness_s + %(slack)s)
                  < r.started_at
              AND (y.state = %(missed)s OR y.lane = %(catchup_lane)s)
            LIMIT r.allowed + 1
        ) later
    )
    ORDER BY r.scheduled_for, r.id
"""
# A MISSED instant the policy let run (step 6, the other way round). The later late instants
# are counted as misfire.py counts them when it judges (MISSED, catch-up lane, open and late),
# so the judge's "rank > allowed" leaves at least `allowed` of them for the audit to find.
# Only where that count is complete and the policy known: an instant of the schedule's
# current version (an update may change the policy), the schedule still ACTIVE (a pause or a
# cancel stops the instants it had counted unwritten), its frontier past the cutoff (none
# left unwritten), and no later instant withdrawn by a change or a cancel.
_TOO_FEW_SQL = """
    SELECT o.id, o.schedule_id, o.schedule_version, o.scheduled_for, s.misfire_policy,
           count(*) OVER ()
    FROM occurrences_occurrence o
    JOIN schedules_schedule s ON s.id = o.schedule_id
    WHERE o.scheduled_for >= %(start)s AND o.scheduled_for < %(end)s {tenant}
      AND o.state = %(missed)s AND o.origin = %(scheduled_origin)s
      AND s.misfire_policy IN (%(fire_once)s, %(catchup_policy)s)
      AND o.schedule_version = s.version AND s.state = %(active)s
      AND s.next_run_at >= %(now)s - make_interval(secs => s.max_lateness_s)
      AND NOT EXISTS (
          SELECT 1 FROM occurrences_occurrence w
          WHERE w.schedule_id = o.schedule_id AND w.scheduled_for > o.scheduled_for
            AND w.state IN (%(canceled)s, %(superseded)s)
      )
      AND CASE s.misfire_policy WHEN %(fire_once)s THEN 1 ELSE s.catchup_limit END > (
          SELECT count(*) FROM (
              SELECT 1 FROM occurrences_occurrence y
              WHERE y.schedule_id = o.schedule_id AND y.scheduled_for > o.scheduled_for
                AND y.origin = %(scheduled_origin)s
                AND y.scheduled_for < %(now)s - make_interval(secs => s.max_lateness_s)
                AND (y.state = %(missed)s OR y.lane = %(catchup_lane)s
                     OR (y.state IN (%(scheduled)s, %(enqueued)s) AND y.attempt_count = 0
                         AND y.available_at
                             < %(now)s - make_interval(secs => s.max_lateness_s)))
              LIMIT CASE s.misfire_policy WHEN %(fire_once)s THEN 1 ELSE s.catchup_limit END
          ) later
      )
    ORDER BY o.scheduled_for, o.id
"""
_BREACH_CLASS = {
    Schedule.MisfirePolicy.SKIP: "late_run_skip",
    Schedule.MisfirePolicy.FIRE_ONCE: "late_runs_fire_once",
    Schedule.MisfirePolicy.CATCHUP: "late_runs_catchup",
}


def _audit_misfire(report: ReconcileReport, *, tenant_id: uuid.UUID | None) -> None:
    """Step 6: late runs that broke their schedule's misfire policy."""
    params: dict[str, Any] = {
        "start": report.start,
        "end": report.end,
        "tenant": tenant_id,
        "fire_once": Schedule.MisfirePolicy.FIRE_ONCE,
        "catchup_policy": Schedule.MisfirePolicy.CATCHUP,
        "scheduled_origin": Occurrence.Origin.SCHEDULED,
        "catchup_lane": Lane.CATCHUP,
        "missed": Occurrence.State.MISSED,
        "slack": POLICY_SLACK_S,
    }
    tenant = "AND o.tenant_id = %(tenant)s" if tenant_id is not None else ""
    with connection.cursor() as cursor:
        cursor.execute(_POLICY_BREACH_SQL.format(tenant=tenant), params)
        for occ_id, sid, version, at, policy, count in cursor.fetchall():
            found = Finding("", str(sid), version, at.isoformat(), str(occ_id), policy)
            _breach(report, _BREACH_CLASS.get(policy, "late_run_skip"), count, found)
        cursor.execute(_TOO_FEW_SQL.format(tenant=tenant), {
            **params, "now": report.now, "active": Schedule.State.ACTIVE,
            "canceled": Occurrence.State.CANCELED, "superseded": Occurrence.State.SUPERSEDED,
            "scheduled": Occurrence.State.SCHEDULED, "enqueued": Occurrence.State.ENQUEUED,
        })  # fmt: skip
        for occ_id, sid, version, at, policy, count in cursor.fetchall():
            found = Finding("", str(sid), version, at.isoformat(), str(occ_id), policy)
            _breach(report, "late_runs_too_few", count, found)


def _breach(report: ReconcileReport, kind: str, count: int, finding: Finding) -> None:
    report.counts[kind] = int(count)
    bucket = report.samples[kind]
    if len(bucket) < SAMPLE_LIMIT:
        bucket.append(replace(finding, kind=kind))
