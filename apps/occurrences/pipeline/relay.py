"""Dispatch: publish due outbox rows to RabbitMQ, then record them
(docs/decisions.md "Relay publishing").

One step (`relay_step`):
1. In a transaction, lock this process's relay shard leases FOR KEY SHARE and keep those still
   held (the fence), then read the due outbox rows of those shards (`available_at <= now +
   look-ahead`), skipping rows already published and waiting to be recorded. No row locks:
   the fenced lease makes this process the only relay of its shards, and a schedule change
   that removes outbox rows takes the shard's relay lease row FOR UPDATE
   (`leases.relay_shard_barrier`), so it waits for an in-flight step instead of racing it.
   The look-ahead lets a burst be read and its messages built *before* its instant.
2. Group the rows per instant into messages: one occurrence per message, or an envelope of up
   to `envelope_max` occurrences of one tenant and lane due at the same instant (a burst).
   Tenants take turns (round-robin) within an instant. Wait until each instant (never publish
   early), then publish with publisher confirms and `mandatory`.
3. Record the confirmed rows only: `enqueued_at` (the first confirm time; `last_enqueued_at`
   the latest, the backstop's clock) and ENQUEUED, and delete their outbox rows, in one
   fenced transaction — inline, or on the `Recorder` thread so the next instant's
   publishing does not wait for a 100k-row update. Failed publishes stay in the outbox for
   the next step.
A crash after a confirm and before the record commits leaves the rows in the outbox: they are
published again with the same occurrence ids (accepted duplicates, dropped at claim).
Marking rows sent before the broker confirmed them would lose occurrences: never done.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
import uuid
from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple, TypeVar

from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from apps.core.config import SettingsConfig, setting
from apps.occurrences.alert_records import DEAD_ALERT_PARAMS, dead_alerts_cte
from apps.occurrences.misfire import RELAY_JUDGE_FLOOR, misfire_judge
from apps.occurrences.models import Lane, Occurrence, ShardLease
from apps.occurrences.observability import metrics
from apps.occurrences.pipeline.broker import OutgoingMessage, Publisher, occurrence_message
from apps.occurrences.pipeline.bulk import array_literal
from apps.occurrences.pipeline.leases import LeaseSet
from apps.occurrences.pipeline.outages import drop_database_connection
from apps.occurrences.pipeline.queues import (
    ENVELOPE_TASK_NAME,
    queue_name,
    tenant_partition,
)
from apps.occurrences.pipeline.throttle import TenantThrottle

log = logging.getLogger(__name__)
_T = TypeVar("_T")


# The relay publishes a row once its `available_at` has come by its own host's clock, which
# may run a little ahead of another process's: a row due within this may already be
# published (schedule changes' receipts; the claim's check for a reclaimed attempt's copy).
RELAY_CLOCK_SLACK = timedelta(seconds=1)
ONE_MICROSECOND = timedelta(microseconds=1)


# The misfire judge's work per relay step (`judge_late_rows`): late rows in chunks of
# JUDGE_CHUNK_ROWS (~1 s of the judge on a loaded machine when most are found late: 0.6 ms a
# row in docs/performance.md "Thirty minutes at 139k a minute"), no chunk started after
# JUDGE_BUDGET_S. Rows the judge finds on time cost little: a mild backlog is judged whole.
JUDGE_CHUNK_ROWS = 2_000
JUDGE_BUDGET_S = 2.0


class RelayConfig(SettingsConfig):
    lookahead_ms: int = setting("TICK_RELAY_LOOKAHEAD_MS")
    batch_size: int = setting("TICK_RELAY_BATCH")
    prefix: str = setting("TICK_QUEUE_PREFIX")
    partitions: int = setting("TICK_TENANT_PARTITIONS")
    envelope_max: int = setting("TICK_RELAY_ENVELOPE_MAX", default=50)
    background_share: float = 0.2
    max_publish_attempts: int = 5
    judge_chunk_rows: int = JUDGE_CHUNK_ROWS
    judge_budget_s: float = JUDGE_BUDGET_S


@dataclass
class RelayResult:
    claimed: int = 0
    deferred: int = 0
    parked: int = 0
    missed: int = 0
    unjudged: int = 0  # late rows left in the outbox for the next step (`judge_late_rows`)
    published: int = 0
    failed: int = 0
    messages: int = 0
    lags: list[float] = field(default_factory=list)


class OutboxRow(NamedTuple):
    """A claimed outbox row; ids as text, ready for JSON and array literals."""

    id: int
    occurrence_id: str
    scheduled_for: datetime
    schedule_id: str
    schedule_version: int
    tenant_id: str
    lane: str
    available_at: datetime
    shard: int


_CLAIM = """
    SELECT id, occurrence_id::text, scheduled_for, schedule_id::text, schedule_version,
           tenant_id::text, lane, available_at, shard
    FROM occurrences_dispatchoutbox
    WHERE shard = ANY(%s) AND available_at <= %s AND id <> ALL(%s::bigint[])
      AND lane = ANY(%s) AND parked_at IS NULL AND available_at <> ALL(%s::timestamptz[])
    ORDER BY available_at
    LIMIT %s
"""
# Strict capacity is reserved: the on-time lanes are read first with the whole batch; the
# catch-up and retry lanes get at most `background_share` of it per step.
FOREGROUND_LANES: list[str] = [Lane.STRICT, Lane.FLEXIBLE]
BACKGROUND_LANES: list[str] = [Lane.CATCHUP, Lane.RETRY]
# The lag of a strict or catch-up row counts from its instant (`scheduled_for`), of a flexible
# or retry row from when it became due (`available_at`).
_LAG_FROM_SCHEDULED_FOR = (Lane.STRICT, Lane.CATCHUP)

# Occurrences whose publish is pending: a confirm makes them ENQUEUED, a parked row DEAD.
_PENDING_STATES = {
    "scheduled": Occurrence.State.SCHEDULED,
    "retry_wait": Occurrence.State.RETRY_WAIT,
}

# A failed publish backs off (2^attempts s, at most a minute); at the limit the row is parked
# and its occurrence goes DEAD, visible in the DLQ and replayable with the same id.
_FAILED = (
    """
    WITH f AS (SELECT * FROM unnest(%(ids)s::bigint[], %(errors)s::text[]) AS f(id, error)),
    upd AS (
        UPDATE occurrences_dispatchoutbox o
        SET publish_attempts = o.publish_attempts + 1,
            last_error = left(f.error, 1000),
            available_at = now() + make_interval(secs => least(60, 2 ^ o.publish_attempts)),
            parked_at = CASE WHEN o.publish_attempts + 1 >= %(max_attempts)s THEN now() END
        FROM f WHERE o.id = f.id
        RETURNING o.occurrence_id, o.scheduled_for, o.parked_at
    ),
    dead AS (
        UPDATE occurrences_occurrence occ SET state = %(dead)s, finished_at = now()
        FROM upd
        WHERE upd.parked_at IS NOT NULL AND occ.id = upd.occurrence_id
          AND occ.scheduled_for = upd.scheduled_for
          AND occ.state IN (%(scheduled)s, %(retry_wait)s)
        RETURNING occ.id, occ.scheduled_for, occ.schedule_id, occ.tenant_id
    ),"""
    + dead_alerts_cte("alerted", "dead")
    + """
    SELECT count(*) FROM upd WHERE parked_at IS NOT NULL
"""
)

_DEFER = """
    UPDATE occurrences_dispatchoutbox o SET available_at = d.available_at
    FROM unnest(%s::bigint[], %s::timestamptz[]) AS d(id, available_at)
    WHERE o.id = d.id
"""

_RECORD = """
    WITH done AS (
        SELECT * FROM unnest(
            %(outbox_ids)s::bigint[], %(occurrence_ids)s::uuid[], %(scheduled_fors)s::timestamptz[],
            %(confirmed_ats)s::timestamptz[]
        ) AS d(outbox_id, occurrence_id, scheduled_for, confirmed_at)
    ),
    occ AS (
        UPDATE occurrences_occurrence o
        SET enqueued_at = COALESCE(o.enqueued_at, d.confirmed_at),
            last_enqueued_at = GREATEST(o.last_enqueued_at, d.confirmed_at),
            state = CASE WHEN o.state IN (%(scheduled)s, %(retry_wait)s) THEN %(enqueued)s
                         ELSE o.state END
        FROM done d
        WHERE o.id = d.occurrence_id AND o.scheduled_for = d.scheduled_for
        RETURNING 1
    )
    DELETE FROM occurrences_dispatchoutbox WHERE id IN (SELECT outbox_id FROM done)
"""


def _item(row: OutboxRow) -> dict[str, object]:
    return {
        "occurrence_id": row.occurrence_id,
        "scheduled_for": row.scheduled_for.isoformat(),
        "schedule_id": row.schedule_id,
        "schedule_version": row.schedule_version,
        "tenant_id": row.tenant_id,
        "lane": row.lane,
    }


def build_messages(rows: list[OutboxRow], config: RelayConfig) -> list[list[OutgoingMessage]]:
    """Messages per instant (ascending `available_at`), tenants round-robin within each.

    Rows of one tenant and lane due at the same instant travel together in envelopes of up
    to `envelope_max`; a lone row is an ordinary one-occurrence task message.
    """
    by_instant: dict[datetime, list[OutboxRow]] = defaultdict(list)
    for row in rows:
        by_instant[row.available_at].append(row)
    return [
        round_robin(messages_by_tenant(by_instant[instant], config).values())
        for instant in sorted(by_instant)
    ]


def messages_by_tenant(
    rows: list[OutboxRow], config: RelayConfig
) -> dict[str, list[OutgoingMessage]]:
    """The messages of rows due at one instant, per tenant (in order of first appearance)."""
    groups: dict[tuple[str, str], list[OutboxRow]] = defaultdict(list)
    for row in rows:
        groups[(row.tenant_id, row.lane)].append(row)
    per_tenant: dict[str, list[OutgoingMessage]] = defaultdict(list)
    for (tenant_id, lane), group in groups.items():
        queue = queue_name(config.prefix, lane, tenant_partition_of(tenant_id, config.partitions))
        per_tenant[tenant_id].extend(
            _message(chunk, queue) for chunk in _chunks(group, config.envelope_max)
        )
    return per_tenant


def round_robin(turns: Iterable[Sequence[_T]]) -> list[_T]:
    """One item of each sequence in turn, until all are used: no tenant's messages all go
    before another's."""
    queues = [deque(turn) for turn in turns if turn]
    ordered: list[_T] = []
    while queues:
        for turn in queues:
            ordered.append(turn.popleft())
        queues = [turn for turn in queues if turn]
    return ordered


def _chunks(rows: list[OutboxRow], size: int) -> Iterator[list[OutboxRow]]:
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


def _message(chunk: list[OutboxRow], queue: str) -> OutgoingMessage:
    keys = tuple(row.id for row in chunk)
    if len(chunk) == 1:
        return occurrence_message(keys, queue, _item(chunk[0]))
    # An envelope's rows share tenant and lane (said once); each item carries what the worker
    # needs to claim it: a 500k burst is ~2.5x fewer bytes for RabbitMQ to persist than with
    # whole items (docs/performance.md).
    first = chunk[0]
    return OutgoingMessage(
        keys,
        queue,
        ENVELOPE_TASK_NAME,
        # Deterministic too: the same rows republished form the same envelope id.
        f"env-{first.occurrence_id}-{len(chunk)}",
        {
            "tenant_id": first.tenant_id,
            "lane": first.lane,
            "occurrences": [
                {"occurrence_id": row.occurrence_id, "scheduled_for": row.scheduled_for.isoformat()}
                for row in chunk
            ],
        },
    )


@functools.lru_cache(maxsize=65_536)
def tenant_partition_of(tenant_id: str, partitions: int) -> int:
    return tenant_partition(uuid.UUID(tenant_id), partitions)


@dataclass
class ConfirmedBatch:
    """Published rows waiting to be recorded: outbox id -> (row, confirm time)."""

    rows: dict[int, tuple[OutboxRow, datetime]]


def record_confirmed(*, leases: LeaseSet, batch: ConfirmedBatch) -> int:
    """Step 3 in its own fenced transaction; returns the rows recorded (0 if the shards
    were lost meanwhile: the new owner republishes them, same ids)."""
    if not batch.rows:
        return 0
    with transaction.atomic(), connection.cursor() as cursor:
        held = set(leases.fenced_shards())
        ids = [i for i, (row, _) in batch.rows.items() if row.shard in held]
        if ids:
            cursor.execute(_RECORD, {
                "outbox_ids": array_literal([str(i) for i in ids]),
                "occurrence_ids": array_literal([batch.rows[i][0].occurrence_id for i in ids]),
                "scheduled_fors": array_literal(
                    [batch.rows[i][0].scheduled_for.isoformat() for i in ids]
                ),
                "confirmed_ats": array_literal([batch.rows[i][1].isoformat() for i in ids]),
                "enqueued": Occurrence.State.ENQUEUED,
                **_PENDING_STATES,
            })  # fmt: skip
    return len(ids)


# Rows recorded per transaction. Each holds the shard fence while it runs: 500k rows in one
# statement held it for 40 s here, past the lease TTL, and the shards were lost midway (the
# fence was FOR SHARE then, and the heartbeat's renewal waited for it; it no longer does, but
# a release or a recall still waits for the whole transaction).
RECORD_CHUNK_ROWS = 20_000


def _record_chunks(batch: ConfirmedBatch) -> Iterator[ConfirmedBatch]:
    ids = list(batch.rows)
    for start in range(0, len(ids), RECORD_CHUNK_ROWS):
        yield ConfirmedBatch({i: batch.rows[i] for i in ids[start : start + RECORD_CHUNK_ROWS]})


class Recorder(threading.Thread):
    """Records confirmed batches in order on its own database connection, while the relay
    goes on publishing. `inflight` holds outbox ids published but not yet recorded; the
    claim skips them, so nothing is published twice by the same process."""

    def __init__(self, leases: LeaseSet) -> None:
        super().__init__(name="relay-recorder", daemon=True)
        self.leases = leases
        self.queue: queue.Queue[ConfirmedBatch | None] = queue.Queue()
        self.inflight: set[int] = set()
        self._lock = threading.Lock()
        self.failed: BaseException | None = None

    def submit(self, batch: ConfirmedBatch) -> None:
        with self._lock:
            self.inflight.update(batch.rows)
        self.queue.put(batch)

    def inflight_ids(self) -> list[int]:
        with self._lock:
            return list(self.inflight)

    def any_inflight(self, ids: frozenset[int]) -> bool:
        with self._lock:
            return not self.inflight.isdisjoint(ids)

    def run(self) -> None:
        try:
            while (batch := self.queue.get()) is not None:
                for chunk in _record_chunks(batch):
                    self._record(chunk)
        finally:
            connection.close()

    def _record(self, batch: ConfirmedBatch) -> None:
        try:
            started = time.perf_counter()
            recorded = record_confirmed(leases=self.leases, batch=batch)
            log.info("recorded %d rows in %.2f s", recorded, time.perf_counter() - started)
        except Exception as exc:  # noqa: BLE001 - rows stay in the outbox: republished
            log.exception("recording failed; rows will be republished")
            self.failed = exc
            # A connection the server terminated fails again on reuse; a new one works as
            # soon as the database is back.
            drop_database_connection()
        finally:
            with self._lock:
                self.inflight.difference_update(batch.rows)

    def stop(self) -> None:
        self.queue.put(None)
        self.join()


_DROP_ROWS = "DELETE FROM occurrences_dispatchoutbox WHERE id = ANY(%s::bigint[])"
_TO_CATCHUP_LANE = "UPDATE occurrences_dispatchoutbox SET lane = %s WHERE id = ANY(%s::bigint[])"


def judge_late_rows(
    cursor: CursorWrapper,
    rows: list[OutboxRow],
    result: RelayResult,
    *,
    chunk_rows: int = JUDGE_CHUNK_ROWS,
    budget_s: float = JUDGE_BUDGET_S,
) -> list[OutboxRow]:
    """The misfire policy for rows read late (an outage, a backlog): the rows whose instant
    the policy gives up leave the outbox (their occurrence is MISSED); those it lets run
    late go out in the catch-up lane, paced by the tenant's catch-up rate (misfire.py).
    Retry-lane rows carry work that already started or was delayed on purpose: the claim
    judges those.

    The late rows are judged in chunks of `chunk_rows`, the longest due first, and no chunk
    is started once `budget_s` has gone by (the first always is): the rows not judged are
    left in the outbox untouched and unpublished (`result.unjudged`), and the next step,
    whose read is in due order, reads them first. The judge runs inside the fenced read, and
    unbounded it made one read last tens of seconds in a backlog (docs/decisions.md "A
    bounded misfire judge per relay step")."""
    now = timezone.now()
    # Lateness counts from the row's due time, `available_at`, as in the judge's own query: a
    # flexible row is due up to its window after its instant, and asking about every one read
    # on time cost a join per batch that found nothing (docs/decisions.md "The due cursor").
    late = [r for r in rows if r.lane != Lane.RETRY and r.available_at < now - RELAY_JUDGE_FLOOR]
    if not late:
        return rows
    late.sort(key=lambda r: r.available_at)
    started, judged = time.perf_counter(), 0
    missed: set[str] = set()
    runs: set[str] = set()
    while judged < len(late) and not (judged and time.perf_counter() - started >= budget_s):
        chunk = late[judged : judged + chunk_rows]
        verdicts = misfire_judge(
            cursor, [(r.occurrence_id, r.scheduled_for) for r in chunk], now=now,
            found_by=ShardLease.Role.RELAY,
        )  # fmt: skip
        missed.update(str(i) for i in verdicts.missed)
        runs.update(str(i) for i in verdicts.late_runs)
        judged += len(chunk)
    late, left = late[:judged], {r.id for r in late[judged:]}
    result.unjudged = len(left)
    dropped = [r.id for r in late if r.occurrence_id in missed]
    moved = [r.id for r in late if r.occurrence_id in runs and r.lane != Lane.CATCHUP]
    if dropped:
        cursor.execute(_DROP_ROWS, [array_literal([str(i) for i in dropped])])
        result.missed = len(dropped)
    if moved:
        cursor.execute(_TO_CATCHUP_LANE, [Lane.CATCHUP, array_literal([str(i) for i in moved])])
    gone, catchup = set(dropped) | left, set(moved)
    return [
        row._replace(lane=Lane.CATCHUP) if row.id in catchup else row
        for row in rows
        if row.id not in gone
    ]


def apply_quotas(
    cursor: CursorWrapper, rows: list[OutboxRow], throttle: TenantThrottle, result: RelayResult
) -> list[OutboxRow]:
    """Keep the rows each tenant's quota allows now; defer the others' outbox rows to the
    instant their tenant's bucket allows them (nothing is dropped). The buckets are shared
    by all relays: one statement for the whole batch (throttle.py)."""
    allowed: list[OutboxRow] = []
    deferred_ids: list[str] = []
    deferred_at: list[str] = []
    ordered = sorted(rows, key=lambda r: r.available_at)
    releases = throttle.deferrals(ordered)
    for row, release in zip(ordered, releases, strict=True):
        if release is None:
            allowed.append(row)
        else:
            deferred_ids.append(str(row.id))
            deferred_at.append(release.isoformat())
    if deferred_ids:
        cursor.execute(_DEFER, [array_literal(deferred_ids), array_literal(deferred_at)])
        result.deferred = len(deferred_ids)
    return allowed


def prepare_messages(
    publisher: Publisher, messages: list[OutgoingMessage], failed: dict[int, str]
) -> list[tuple[OutgoingMessage, Any]]:
    """Serialise each message; one that cannot be built fails alone (a poison row must not
    stop the rows behind it)."""
    prepared = []
    for message in messages:
        try:
            prepared.extend(publisher.prepare([message]))
        except Exception as exc:  # noqa: BLE001 - recorded on the row, then retried/parked
            for key in message.keys:
                failed[key] = f"cannot build message: {type(exc).__name__}: {exc}"
    return prepared


def record_failures(leases: LeaseSet, failed: dict[int, str], max_attempts: int) -> int:
    """Back off the failed rows, parking those at the attempt limit; returns how many."""
    with transaction.atomic(), connection.cursor() as cursor:
        if not leases.fenced_shards():
            return 0
        ids = list(failed)
        cursor.execute(_FAILED, {
            "ids": ids,
            "errors": [failed[i] for i in ids],
            "max_attempts": max_attempts,
            "dead": Occurrence.State.DEAD,
            **_PENDING_STATES,
            **DEAD_ALERT_PARAMS,
        })  # fmt: skip
        row = cursor.fetchone()
    parked = int(row[0]) if row else 0
    if parked:
        log.error("%d outbox rows parked after %d failed publishes", parked, max_attempts)
        metrics.outbox_parked.inc(parked)
    return parked


def relay_step(
    *,
    leases: LeaseSet,
    publisher: Publisher,
    config: RelayConfig,
    recorder: Recorder | None = None,
    throttle: TenantThrottle | None = None,
    before: datetime | None = None,
    skip: Sequence[datetime] = (),
) -> RelayResult:
    """Read, publish and record one batch (module docstring, steps 1-3). Without a
    `recorder`, recording happens before returning. With `before`, only rows due earlier are
    read: the instant a `Stager` holds is its to publish, and a step must not sleep past it.
    Rows due at a `skip` instant are not read (a staged burst still being recorded: its
    100k+ published rows would be scanned by every read until then; `Stager.settling`)."""
    result = RelayResult()
    failed: dict[int, str] = {}
    # The read is fenced; the fence is then let go while the messages are built and their
    # instant is awaited, and taken again to publish: a schedule change (relay_shard_barrier)
    # waits only for a publish in flight, and one that committed meanwhile has moved its
    # shard's `recalls`, so those rows are left for the next step (publish_on_time).
    with transaction.atomic(), connection.cursor() as cursor:
        shards = leases.fenced_shards()
        if not shards:
            return result
        started = time.perf_counter()
        marks = shard_marks(cursor, leases, shards)
        rows = _read_due(cursor, shards, config, recorder, before, skip)
        result.claimed = len(rows)
        rows = judge_late_rows(
            cursor, rows, result, chunk_rows=config.judge_chunk_rows,
            budget_s=config.judge_budget_s,
        )  # fmt: skip
        if throttle is not None and rows:
            rows = apply_quotas(cursor, rows, throttle, result)
    if not rows:
        return result
    metrics.outbox_backlog.set(len(rows))
    claimed_at = time.perf_counter()
    by_id = {row.id: row for row in rows}
    groups = [
        prepared
        for messages in build_messages(rows, config)
        if (prepared := prepare_messages(publisher, messages, failed))
    ]
    built_at = time.perf_counter()
    confirmed = publish_on_time(
        leases=leases, publisher=publisher, config=config, groups=groups, by_id=by_id,
        marks=marks, failed=failed, result=result,
    )  # fmt: skip
    published_at = time.perf_counter()
    if failed:
        log.warning(
            "%d outbox rows not published (e.g. %s)", len(failed), next(iter(failed.values()))
        )
        result.failed = len(failed)
        result.parked = record_failures(leases, failed, config.max_publish_attempts)
    batch = ConfirmedBatch({i: (by_id[i], at) for i, at in confirmed.items()})
    if recorder is not None:
        recorder.submit(batch)
    else:
        record_confirmed(leases=leases, batch=batch)
    result.published = len(confirmed)
    log.info(
        "relay step: %d rows read in %.2f s, messages built in %.2f s, published in %.2f s",
        len(rows), claimed_at - started, built_at - claimed_at, published_at - built_at,
    )  # fmt: skip
    count_published(batch, result)
    return result


def _read_due(
    cursor: CursorWrapper,
    shards: list[int],
    config: RelayConfig,
    recorder: Recorder | None,
    before: datetime | None,
    skip: Sequence[datetime] = (),
) -> list[OutboxRow]:
    """Step 1's read: due rows of the fenced `shards` within the look-ahead (and before
    `before`), minus those published and waiting to be recorded; the on-time lanes first with
    the whole batch."""
    until = timezone.now() + timedelta(milliseconds=config.lookahead_ms)
    if before is not None:
        until = min(until, before - ONE_MICROSECOND)
    skipped = array_literal([instant.isoformat() for instant in skip])
    inflight = array_literal([str(i) for i in (recorder.inflight_ids() if recorder else [])])
    rows: list[OutboxRow] = []
    for lanes, limit in (
        (FOREGROUND_LANES, config.batch_size),
        (BACKGROUND_LANES, max(1, int(config.batch_size * config.background_share))),
    ):
        cursor.execute(_CLAIM, [shards, until, inflight, array_literal(lanes), skipped, limit])
        rows.extend(OutboxRow(*values) for values in cursor.fetchall())
    return rows


def shard_marks(
    cursor: CursorWrapper, leases: LeaseSet, shards: list[int]
) -> dict[int, tuple[int, int]]:
    """(lease generation, recalls) of the fenced `shards`. The caller holds the fence, so
    neither moves until its transaction ends; rows read under these marks may be published
    later only while the marks are unchanged."""
    cursor.execute(_RECALLS, [ShardLease.Role.RELAY, shards])
    return {shard: (leases.held[shard], recalls) for shard, recalls in cursor.fetchall()}


_RECALLS = "SELECT shard, recalls FROM occurrences_shardlease WHERE role = %s AND shard = ANY(%s)"


def publish_on_time(
    *,
    leases: LeaseSet,
    publisher: Publisher,
    config: RelayConfig,
    groups: list[list[tuple[OutgoingMessage, Any]]],
    by_id: dict[int, OutboxRow],
    marks: dict[int, tuple[int, int]],
    failed: dict[int, str],
    result: RelayResult,
) -> dict[int, datetime]:
    """Step 2's publish: each group (one instant) when its instant arrives, never early,
    without holding the fence while waiting; then, fenced, publish the group's messages
    whose rows' shards still carry `marks` (messages carrying a row of a shard whose mark
    moved are built again without those rows, which stay in the outbox for the next read).
    Returns the confirm time per outbox id and adds the failures to `failed`."""
    confirmed: dict[int, datetime] = {}
    for prepared in groups:
        # Every message of this group shares its instant: wait for it, then publish.
        due_at = by_id[prepared[0][0].keys[0]].available_at
        wait = (due_at - timezone.now()).total_seconds()
        if wait > 0:
            time.sleep(wait)
        with transaction.atomic(), connection.cursor() as cursor:
            current = shard_marks(cursor, leases, leases.fenced_shards())
            moved = {shard for shard, mark in marks.items() if current.get(shard) != mark}
            if moved:
                prepared = _without_shards(publisher, config, prepared, by_id, moved, failed)
            if not prepared:
                continue
            outcome = publisher.publish_prepared(prepared)
        result.messages += len(prepared)
        confirmed.update(outcome.confirmed)
        failed.update(outcome.failed)
    return confirmed


def _without_shards(
    publisher: Publisher,
    config: RelayConfig,
    prepared: list[tuple[OutgoingMessage, Any]],
    by_id: dict[int, OutboxRow],
    shards: set[int],
    failed: dict[int, str],
) -> list[tuple[OutgoingMessage, Any]]:
    """One instant's messages rebuilt without the rows of `shards`."""
    rows = [by_id[key] for message, _ in prepared for key in message.keys]
    kept = [row for row in rows if row.shard not in shards]
    log.info(
        "%d rows left for the next read: their shard was recalled or moved", len(rows) - len(kept)
    )
    return [
        item
        for messages in build_messages(kept, config)
        for item in prepare_messages(publisher, messages, failed)
    ]


def count_published(batch: ConfirmedBatch, result: RelayResult) -> None:
    """Lag and publish metrics of a step; the lags also go into `result`. Rows sharing a lane
    and a lag (an envelope's) are observed together."""
    same: Counter[tuple[str, float]] = Counter()
    for row, at in batch.rows.values():
        reference = row.scheduled_for if row.lane in _LAG_FROM_SCHEDULED_FOR else row.available_at
        lag = (at - reference).total_seconds()
        result.lags.append(lag)
        same[(row.lane, lag)] += 1
    for (lane, lag), count in same.items():
        metrics.observe_many(metrics.schedule_lag_seconds.labels(lane=lane), lag, count)
        # SCHEDULED ends at the confirm; its time is counted from when it came due.
        metrics.observe_many(
            metrics.occurrence_state_seconds.labels(state=Occurrence.State.SCHEDULED),
            max(lag, 0.0),
            count,
        )
        metrics.published.labels(lane=lane).inc(count)
    metrics.publish_failures.inc(result.failed)
