"""The misfire policy: which of a schedule's late instants still run (docs/decisions.md
"Misfire wherever lateness is found").

An instant is *late* once it is older than `now - max_lateness_s` (measured from the
occurrence's `available_at`: the instant itself, or a flexible one's offset within its window)
and its first attempt has not started. Lateness is found in three places - the materializer
writes instants late, the relay reads outbox rows late, a claim takes a message late - and
all three apply the same rule, `late_runs_allowed`:

- SKIP: none runs; every late instant is MISSED.
- FIRE_ONCE: only the latest late instant of the schedule runs; the others are MISSED.
- CATCHUP: at most `catchup_limit` of the latest late instants run; the others are MISSED.

"Latest" ranks an instant among the schedule's *late* instants after it: those recorded
MISSED, those let run late (their lane is CATCHUP), those still waiting to run and late now,
and those the materializer has not written yet (the schedule's `next_run_at` is older than
the cutoff). An instant that ran on time does not count, so a catch-up paced over a minute
keeps its runs while the next on-time instants go by. An instant let run late moves to the
catch-up lane: the relay paces it by the tenant's catch-up rate and the workers take it as
recovery work, never from the strict lane's slots.

`misfire_judge` applies the rule to a set of waiting occurrences in one statement's worth of
SQL (the later late instants counted per occurrence, up to the limit, through
`occurrence_schedule_time_idx`), marks the losers MISSED and records one `missed` event per
schedule, as the materializer does; every MISSED instant here already has its row.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction
from django.db.backends.utils import CursorWrapper

from apps.occurrences.alert_records import record_schedule_event_alerts_by_id
from apps.occurrences.models import Lane, Occurrence
from apps.occurrences.observability import metrics
from apps.occurrences.pipeline.bulk import array_literal
from apps.schedules.models import Schedule, ScheduleEvent
from apps.schedules.services import rule_times_between

ONE_MICROSECOND = timedelta(microseconds=1)

# The relay asks about rows at least this late (past their `available_at`) only: a row read
# on time is late by the milliseconds of its publish, which no policy judges (the claim still
# does, exactly).
RELAY_JUDGE_FLOOR = timedelta(seconds=1)

# States in which an occurrence waits for its first attempt and its instant may still be
# given up. WAITING (parked behind a QUEUE_ONE run) waits by the overlap policy's choice.
_OPEN_STATES = (Occurrence.State.SCHEDULED, Occurrence.State.ENQUEUED)


def late_runs_allowed(policy: str, catchup_limit: int) -> int:
    """How many of a schedule's latest late instants may still run under `policy`."""
    if policy == Schedule.MisfirePolicy.FIRE_ONCE:
        return 1
    if policy == Schedule.MisfirePolicy.CATCHUP:
        return max(0, catchup_limit)
    return 0


@dataclass
class Verdicts:
    """What `misfire_judge` decided: occurrence ids MISSED, and those let run late (now in the
    catch-up lane)."""

    missed: set[uuid.UUID] = field(default_factory=set)
    late_runs: set[uuid.UUID] = field(default_factory=set)


# The candidates that are late and still open, with their schedule's rule and how many of the
# schedule's instants after each are late too (counted up to the policy's limit + 1).
_LATE_CANDIDATES = """
    WITH c AS (
        SELECT * FROM unnest(%(ids)s::uuid[], %(ats)s::timestamptz[]) AS c(id, scheduled_for)
    )
    SELECT o.id, o.scheduled_for, o.lane, o.tenant_id, o.schedule_version,
           s.id, s.kind, s.expression, s.time_zone, s.dst_gap, s.dst_fold,
           s.next_run_at, s.end_at, s.state, s.version, s.misfire_policy, s.catchup_limit,
           s.max_lateness_s, s.interval_s, s.start_at,
           (SELECT count(*) FROM (
                SELECT 1 FROM occurrences_occurrence y
                WHERE y.schedule_id = o.schedule_id AND y.scheduled_for > o.scheduled_for
                  AND y.scheduled_for < %(now)s - make_interval(secs => s.max_lateness_s)
                  AND y.origin = %(scheduled_origin)s
                  AND (y.state = %(missed)s OR y.lane = %(catchup_lane)s
                       OR (y.state = ANY(%(open)s) AND y.attempt_count = 0
                           AND y.available_at
                               < %(now)s - make_interval(secs => s.max_lateness_s)))
                LIMIT 1 + CASE s.misfire_policy WHEN %(fire_once)s THEN 1
                                                WHEN %(catchup_policy)s THEN s.catchup_limit
                                                ELSE 0 END
           ) later) AS later_late
    FROM c
    JOIN occurrences_occurrence o ON o.id = c.id AND o.scheduled_for = c.scheduled_for
    JOIN schedules_schedule s ON s.id = o.schedule_id
    WHERE o.state = ANY(%(open)s) AND o.attempt_count = 0 AND o.origin = %(scheduled_origin)s
      AND o.available_at < %(now)s - make_interval(secs => s.max_lateness_s)
    FOR UPDATE OF o
"""

_MARK_MISSED = """
    UPDATE occurrences_occurrence o SET state = %(missed)s, finished_at = %(now)s
    FROM unnest(%(ids)s::uuid[], %(ats)s::timestamptz[]) AS m(id, scheduled_for)
    WHERE o.id = m.id AND o.scheduled_for = m.scheduled_for
"""

_MARK_LATE_RUN = """
    UPDATE occurrences_occurrence o SET lane = %(catchup_lane)s
    FROM unnest(%(ids)s::uuid[], %(ats)s::timestamptz[]) AS m(id, scheduled_for)
    WHERE o.id = m.id AND o.scheduled_for = m.scheduled_for AND o.lane <> %(catchup_lane)s
"""


@dataclass
class _Late:
    occurrence_id: uuid.UUID
    scheduled_for: datetime
    lane: str
    tenant_id: uuid.UUID
    version: int
    schedule_id: uuid.UUID
    kind: str
    expression: str
    time_zone: str
    dst_gap: str
    dst_fold: str
    next_run_at: datetime | None
    end_at: datetime | None
    schedule_state: str
    schedule_version: int
    policy: str
    catchup_limit: int
    max_lateness_s: int
    interval_s: int | None
    start_at: datetime | None
    later_late: int


def misfire_judge(
    cursor: CursorWrapper,
    candidates: Iterable[tuple[uuid.UUID | str, datetime]],
    *,
    now: datetime,
    found_by: str,
    record_limit: int = 10,
) -> Verdicts:
    """Apply the misfire rule (module docstring) to the open, late ones among `candidates`
    ((occurrence id, scheduled_for) pairs), inside the caller's transaction: the losers become
    MISSED (one `missed` event per schedule, naming up to `record_limit` instants), the
    winners move to the catch-up lane. Candidates that are not late or not open are left
    alone and appear in neither set."""
    pairs = list(candidates)
    verdicts = Verdicts()
    if not pairs:
        return verdicts
    cursor.execute(_LATE_CANDIDATES, {
        "ids": array_literal([str(i) for i, _ in pairs]),
        "ats": array_literal([at.isoformat() for _, at in pairs]),
        "now": now,
        "open": [str(state) for state in _OPEN_STATES],
        "missed": Occurrence.State.MISSED,
        "catchup_lane": Lane.CATCHUP,
        "scheduled_origin": Occurrence.Origin.SCHEDULED,
        "fire_once": Schedule.MisfirePolicy.FIRE_ONCE,
        "catchup_policy": Schedule.MisfirePolicy.CATCHUP,
    })  # fmt: skip
    late = [_Late(*row) for row in cursor.fetchall()]
    if not late:
        return verdicts
    unwritten: dict[uuid.UUID, int] = {}
    missed: list[_Late] = []
    runs: list[_Late] = []
    for item in late:
        allowed = late_runs_allowed(item.policy, item.catchup_limit)
        if item.schedule_id not in unwritten:
            unwritten[item.schedule_id] = _late_unwritten(item, now, allowed + 1)
        rank = item.later_late + unwritten[item.schedule_id] + 1
        (runs if rank <= allowed else missed).append(item)
    if missed:
        cursor.execute(_MARK_MISSED, {
            "missed": Occurrence.State.MISSED, "now": now,
            "ids": array_literal([str(m.occurrence_id) for m in missed]),
            "ats": array_literal([m.scheduled_for.isoformat() for m in missed]),
        })  # fmt: skip
        _record_missed(cursor, missed, now, found_by, record_limit)
        verdicts.missed = {m.occurrence_id for m in missed}
    moved = [r for r in runs if r.lane != Lane.CATCHUP]
    if moved:
        cursor.execute(_MARK_LATE_RUN, {
            "catchup_lane": Lane.CATCHUP,
            "ids": array_literal([str(r.occurrence_id) for r in moved]),
            "ats": array_literal([r.scheduled_for.isoformat() for r in moved]),
        })  # fmt: skip
    verdicts.late_runs = {r.occurrence_id for r in runs}
    return verdicts


def _late_unwritten(item: _Late, now: datetime, limit: int) -> int:
    """The schedule's late instants the materializer has not written yet: rule instants in
    [next_run_at, now - max_lateness), counted up to `limit`."""
    cutoff = now - timedelta(seconds=item.max_lateness_s)
    start = item.next_run_at
    if (
        item.schedule_state != Schedule.State.ACTIVE
        or start is None
        or start >= cutoff
        or item.version != item.schedule_version
    ):
        return 0
    if item.kind == Schedule.Kind.ONE_SHOT:
        return 1
    until = cutoff - ONE_MICROSECOND
    if item.end_at is not None and until >= item.end_at:
        until = item.end_at - ONE_MICROSECOND
    if until < start:
        return 0
    return len(rule_times_between(item, start - ONE_MICROSECOND, until, limit=limit))


# One `missed` event per schedule among the MISSED rows (their schedule, instant and
# occurrence's schedule version), written in one statement: built through the ORM, the
# events cost more Python per late row than the judge's query (docs/performance.md "Catching
# up after a relay stall"). The detail is the materializer's: the policy, the latest
# `limit` instants (ascending), all counted, every one with its row.
_RECORD_MISSED = """
    WITH m AS (
        SELECT * FROM unnest(%(schedule_ids)s::uuid[], %(ats)s::timestamptz[],
                             %(versions)s::int[]) AS m(schedule_id, scheduled_for, version)
    ),
    g AS (
        SELECT schedule_id, count(*) AS n,
               (array_agg(scheduled_for ORDER BY scheduled_for DESC))[1:%(limit)s] AS latest,
               (array_agg(version ORDER BY scheduled_for))[1] AS version
        FROM m GROUP BY schedule_id
    )
    INSERT INTO schedules_scheduleevent (schedule_id, tenant_id, kind, version, actor, at, detail)
    SELECT g.schedule_id, s.tenant_id, %(kind)s, g.version, %(found_by)s, %(now)s,
           jsonb_build_object(
               'policy', s.misfire_policy,
               'recorded', (SELECT jsonb_agg(to_jsonb(t.at) ORDER BY t.at)
                            FROM unnest(g.latest) AS t(at)),
               'missed_count', g.n, 'count_exact', true, 'found_by', %(found_by)s::text)
    FROM g JOIN schedules_schedule s ON s.id = g.schedule_id
    RETURNING id
"""


def _record_missed(
    cursor: CursorWrapper, missed: list[_Late], now: datetime, found_by: str, record_limit: int
) -> None:
    """One `missed` event per schedule (the latest `record_limit` instants named, all
    counted), with its alerts, as the materializer records its own."""
    cursor.execute(_RECORD_MISSED, {
        "schedule_ids": array_literal([str(m.schedule_id) for m in missed]),
        "ats": array_literal([m.scheduled_for.isoformat() for m in missed]),
        "versions": array_literal([str(m.version) for m in missed]),
        "limit": record_limit, "kind": ScheduleEvent.Kind.MISSED, "found_by": found_by,
        "now": now,
    })  # fmt: skip
    record_schedule_event_alerts_by_id(cursor, [row[0] for row in cursor.fetchall()])
    count = len(missed)
    transaction.on_commit(lambda: metrics.occurrences_missed.inc(count))
