"""The backstop: a visibility timeout kept in the database, because the broker cannot be
trusted to deliver what it confirmed.

A message can be acknowledged without its work being done (a task that raised while the
database restarted, a purged queue, a lost broker node). Its occurrence then stays ENQUEUED
(or WAITING, when the lost message was a QUEUE_ONE re-check) with no attempt, and nothing
else would ever move it: the lease reaper only sees RUNNING attempts.
`occurrences_redeliver` (run by `manage.py reap`) republishes such occurrences through the
outbox with the same id once nothing claimed them for `after_s` after their latest broker
confirm (`last_enqueued_at`, recorded by the relay).

A republish during a legitimate backlog longer than the bound is only a same-id duplicate:
the claim drops whichever copy comes second. Each occurrence is republished at most once
per bound: while its row waits in the outbox it is skipped, and once the relay records the
republish `last_enqueued_at` moves to the new confirm.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from apps.occurrences.models import Lane, Occurrence, attempt_open_by_key
from apps.occurrences.observability import metrics
from apps.occurrences.pipeline.outbox import outbox_insert

# One retry-lane outbox row, due now, per redelivered occurrence (same id).
_REDELIVERED_OUTBOX = outbox_insert(
    occurrence_id="id",
    lane="%(lane)s",
    available_at="%(now)s",
    source="FROM redelivered",
    returning="RETURNING 1",
)

# `lost` walks occurrence_open_idx (unfinished occurrences by instant: the in-flight work
# only) over the lookback; the first confirm is never later than the latest, so
# `enqueued_at < cutoff` only filters (the index leaves enqueued_at out so that recording
# it can be a HOT update).
# The outbox has no index on occurrence_id: the schedule's shard narrows the pending-row
# probe through outbox_due_idx, so no plan can scan the whole outbox once per candidate.
# SKIP LOCKED: an occurrence being claimed right now is left to its claim.
_REDELIVER = f"""
    WITH lost AS (
        SELECT o.id, o.scheduled_for, s.shard
        FROM occurrences_occurrence o
        JOIN schedules_schedule s ON s.id = o.schedule_id
        WHERE o.scheduled_for >= %(since)s AND o.scheduled_for <= %(now)s
          AND o.enqueued_at IS NOT NULL AND o.finished_at IS NULL
          AND o.enqueued_at < %(cutoff)s
          AND o.state = ANY(%(states)s)
          AND COALESCE(o.last_enqueued_at, o.enqueued_at) < %(cutoff)s
          AND NOT EXISTS (
              SELECT 1 FROM occurrences_attempt a
              WHERE a.occurrence_id = o.id AND a.scheduled_for = o.scheduled_for
                AND {attempt_open_by_key("a")}
          )
          AND NOT EXISTS (
              SELECT 1 FROM occurrences_dispatchoutbox x
              WHERE x.shard = s.shard AND x.parked_at IS NULL
                AND x.occurrence_id = o.id AND x.scheduled_for = o.scheduled_for
          )
        ORDER BY o.enqueued_at
        LIMIT %(limit)s
        FOR UPDATE OF o SKIP LOCKED
    ),
    redelivered AS (
        UPDATE occurrences_occurrence o
        SET redelivery_count = o.redelivery_count + 1, last_redelivered_at = %(now)s
        FROM lost l
        WHERE o.id = l.id AND o.scheduled_for = l.scheduled_for
          AND o.scheduled_for >= %(since)s AND o.scheduled_for <= %(now)s
        RETURNING o.id, o.scheduled_for, o.schedule_id, o.schedule_version, o.tenant_id, l.shard
    ),
    outbox AS ({_REDELIVERED_OUTBOX})
    SELECT count(*) FROM outbox
"""


@dataclass(frozen=True)
class RedeliverResult:
    republished: int


# ENQUEUED: published, never claimed. WAITING: parked behind a QUEUE_ONE run, kept alive by
# a re-check message every TICK_OVERLAP_RECHECK_S (each confirm moves `last_enqueued_at`):
# one whose re-check message was lost has no outbox row and a confirm that stopped moving.
REDELIVERED_STATES = (Occurrence.State.ENQUEUED, Occurrence.State.WAITING)
# The deep pass (`deep=True`) has no look-back: an occurrence ENQUEUED for longer than it (a
# backfilled instant of last week, a row stranded across a long outage) is redelivered too.
DISTANT_PAST = datetime(1970, 1, 1, tzinfo=UTC)


def occurrences_redeliver(
    *,
    now: datetime,
    after_s: int,
    limit: int = 1000,
    lookback_s: int | None = None,
    deep: bool = False,
) -> RedeliverResult:
    """Republish, in one set-based statement and transaction, up to `limit` occurrences
    that are ENQUEUED with no open attempt and no pending outbox row, and whose latest
    broker confirm is more than `after_s` old: an outbox row in the retry lane due `now`
    with the same occurrence id, and `redelivery_count`/`last_redelivered_at` recorded.

    Only occurrences scheduled in the last `lookback_s` (default TICK_RETRY_DEADLINE_S)
    are looked at, so partitions are pruned; with `deep`, every partition is (the reaper
    runs that pass every TICK_REDELIVER_DEEP_EVERY_S): ENQUEUED or WAITING rows scheduled
    longer ago - backfilled instants, rows left across a long outage - are not left behind.
    """
    lookback = settings.TICK_RETRY_DEADLINE_S if lookback_s is None else lookback_s
    since = DISTANT_PAST if deep else now - timedelta(seconds=lookback)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            _REDELIVER,
            {
                "now": now,
                "since": since,
                "cutoff": now - timedelta(seconds=after_s),
                "limit": limit,
                "states": [str(state) for state in REDELIVERED_STATES],
                "lane": Lane.RETRY,
            },
        )
        row = cursor.fetchone()
    assert row is not None
    result = RedeliverResult(republished=int(row[0]))
    metrics.backstop_redeliveries.inc(result.republished)
    return result
