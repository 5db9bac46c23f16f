"""Staging: read a big instant's outbox rows and build its messages before the instant
(docs/decisions.md "Relay staging").

A relay step reads what is due within its look-ahead (`TICK_RELAY_LOOKAHEAD_MS`) in one go;
reading and building take ~5 s per 100k rows on the reference machine (docs/performance.md),
so an instant holding more rows than that cannot be read inside the look-ahead. A `Stager`
finds such an instant early and spreads the work over the time before it:
1. Probe (at most every `probe_every_s`): the first instant in (now + look-ahead,
   now + `horizon_s`] with at least `min_rows` on-time rows in the held shards.
2. Stage, one chunk per loop iteration: in a fenced transaction, note each held shard's
   (lease generation, `recalls`) the first time it is seen, and read the instant's rows by id
   after the last one read (outbox_due_idx carries the id); build and serialise their
   messages per tenant. Rows the materializer adds meanwhile have higher ids: a later chunk
   reads them. Staging stops `stop_before_s` before the instant or at `max_rows` (the memory
   bound).
3. Publish at the instant, in a fenced transaction: keep the rows of the shards whose
   (generation, recalls) has not moved. A schedule change that recalled rows of a shard
   (`relay_shard_barrier` counts it) or a lease that changed hands drops that shard's staged
   rows: the normal step reads them afresh. Apply the tenants' quotas (a tenant with dropped
   or deferred rows has its messages rebuilt), wait for the instant, publish with tenants
   taking turns, and hand the confirms to the recorder, as a step does.
Meanwhile the normal step reads only rows due before the staged instant, so it never sleeps
past it. Rows of the instant that were not staged (committed out of id order, beyond
`max_rows`, or of a dropped shard) are the next normal step's, right after the publish.
Nothing is published before its instant or after a recall: the fence and the counter make the
early read as good as one made at the instant.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from apps.core.config import SettingsConfig, setting
from apps.occurrences.pipeline.broker import OutgoingMessage, Publisher
from apps.occurrences.pipeline.bulk import array_literal
from apps.occurrences.pipeline.leases import LeaseSet
from apps.occurrences.pipeline.relay import (
    FOREGROUND_LANES,
    ConfirmedBatch,
    OutboxRow,
    Recorder,
    RelayConfig,
    RelayResult,
    apply_quotas,
    count_published,
    messages_by_tenant,
    prepare_messages,
    publish_on_time,
    record_confirmed,
    record_failures,
    round_robin,
    shard_marks,
)
from apps.occurrences.pipeline.throttle import TenantThrottle

log = logging.getLogger(__name__)

Prepared = tuple[OutgoingMessage, Any]


class StageConfig(SettingsConfig):
    min_rows: int = setting("TICK_RELAY_STAGE_MIN_ROWS")
    chunk_rows: int = setting("TICK_RELAY_STAGE_CHUNK")
    horizon_s: float = setting("TICK_RELAY_STAGE_HORIZON_S")
    max_rows: int = setting("TICK_RELAY_STAGE_MAX_ROWS")
    probe_every_s: float = 1.0
    # The last chunk (~1 s for 50k rows here) must end before the publish starts, and the
    # publish's preparation (marks, quotas: ~0.7 s for 500k rows) before the instant.
    stop_before_s: float = 4.0
    publish_lead_s: float = 2.5


@dataclass
class StagedInstant:
    """What has been staged of one instant."""

    instant: datetime
    marks: dict[int, tuple[int, int]] = field(default_factory=dict)  # shard -> (gen, recalls)
    rows: dict[int, OutboxRow] = field(default_factory=dict)  # by outbox id
    messages: dict[str, list[Prepared]] = field(default_factory=dict)  # per tenant
    # Rows not yet in a message: a (tenant, lane) group is cut into full envelopes as its
    # rows arrive, chunk after chunk; what is left over is built at the publish.
    unsent: dict[tuple[str, str], list[OutboxRow]] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)  # rows whose message cannot be built
    after_id: int = 0
    read_again_at: float = 0.0  # monotonic; after a short chunk, wait before the next read


_PROBE = """
    SELECT available_at FROM occurrences_dispatchoutbox
    WHERE shard = ANY(%(shards)s) AND available_at > %(after)s AND available_at <= %(until)s
      AND lane = ANY(%(lanes)s) AND parked_at IS NULL
    GROUP BY available_at HAVING count(*) >= %(min_rows)s
    ORDER BY available_at
    LIMIT 1
"""

_READ_CHUNK = """
    SELECT id, occurrence_id::text, scheduled_for, schedule_id::text, schedule_version,
           tenant_id::text, lane, available_at, shard
    FROM occurrences_dispatchoutbox
    WHERE shard = ANY(%(shards)s) AND available_at = %(instant)s AND id > %(after)s
      AND lane = ANY(%(lanes)s) AND parked_at IS NULL
    ORDER BY id
    LIMIT %(limit)s
"""


class Stager:
    """One relay process's staging of the next big instant (module docstring)."""

    def __init__(
        self,
        *,
        leases: LeaseSet,
        publisher: Publisher,
        relay_config: RelayConfig,
        config: StageConfig,
    ) -> None:
        self.leases = leases
        self.publisher = publisher
        self.relay_config = relay_config
        self.config = config
        self.staged: StagedInstant | None = None
        # Instants published from staging whose rows the recorder still holds, with those
        # rows' ids and whether a normal step has read the instant once since (for the rows
        # that were not staged). Until recorded, the published rows are still in the outbox.
        self._settling: dict[datetime, tuple[frozenset[int], bool]] = {}
        self._next_probe = 0.0
        # One object per distinct value: a burst's rows share their instant and tenants.
        self._interned: dict[Any, Any] = {}

    @property
    def instant(self) -> datetime | None:
        return self.staged.instant if self.staged is not None else None

    def settling(self, recorder: Recorder | None) -> list[datetime]:
        """Instants a normal step may skip: published from staging, read once since, and
        still being recorded."""
        for instant, (ids, _) in list(self._settling.items()):
            if recorder is None or not recorder.any_inflight(ids):
                del self._settling[instant]
        return [instant for instant, (_, read) in self._settling.items() if read]

    def stepped(self) -> None:
        """A normal step has run: every settling instant has been read once."""
        self._settling = {instant: (ids, True) for instant, (ids, _) in self._settling.items()}

    def publish_due(self) -> bool:
        lead = timedelta(seconds=self.config.publish_lead_s)
        return self.staged is not None and timezone.now() >= self.staged.instant - lead

    # -- steps 1 and 2 -------------------------------------------------------------------

    def advance(self) -> int:
        """Probe for an instant to stage, or stage one more chunk of it; returns the rows
        staged by this call."""
        now, clock = timezone.now(), time.monotonic()
        if self.staged is None:
            if clock < self._next_probe:
                return 0
            self._next_probe = clock + self.config.probe_every_s
            instant = self._probe(now)
            if instant is None:
                return 0
            self.staged = StagedInstant(instant)
            log.info("staging %s", instant.isoformat())
        staged = self.staged
        if (
            (staged.instant - now).total_seconds() < self.config.stop_before_s
            or len(staged.rows) >= self.config.max_rows
            or clock < staged.read_again_at
        ):
            return 0
        return self._stage_chunk(staged)

    def _probe(self, now: datetime) -> datetime | None:
        shards = sorted(self.leases.held)
        if not shards:
            return None
        lookahead = timedelta(milliseconds=self.relay_config.lookahead_ms)
        with connection.cursor() as cursor:
            cursor.execute(_PROBE, {
                "shards": shards, "after": now + lookahead,
                "until": now + timedelta(seconds=self.config.horizon_s),
                "lanes": array_literal(FOREGROUND_LANES), "min_rows": self.config.min_rows,
            })  # fmt: skip
            found = cursor.fetchone()
        return found[0] if found else None

    def _stage_chunk(self, staged: StagedInstant) -> int:
        started = time.perf_counter()
        limit = min(self.config.chunk_rows, self.config.max_rows - len(staged.rows))
        with transaction.atomic(), connection.cursor() as cursor:
            shards = self.leases.fenced_shards()
            if not shards:
                return 0
            for shard, mark in shard_marks(cursor, self.leases, shards).items():
                staged.marks.setdefault(shard, mark)
            cursor.execute(_READ_CHUNK, {
                "shards": shards, "instant": staged.instant, "after": staged.after_id,
                "lanes": array_literal(FOREGROUND_LANES), "limit": limit,
            })  # fmt: skip
            rows = [self._row(values) for values in cursor.fetchall()]
        read_at = time.perf_counter()
        if len(rows) < limit:
            staged.read_again_at = time.monotonic() + self.config.probe_every_s
        if not rows:
            return 0
        staged.after_id = rows[-1].id
        staged.rows.update((row.id, row) for row in rows)
        for row in rows:
            staged.unsent.setdefault((row.tenant_id, row.lane), []).append(row)
        self._build(staged, full_only=True)
        log.info(
            "staged %d rows of %s (%d in all): read in %.2f s, built in %.2f s",
            len(rows), staged.instant.isoformat(), len(staged.rows), read_at - started,
            time.perf_counter() - read_at,
        )  # fmt: skip
        return len(rows)

    def _build(self, staged: StagedInstant, *, full_only: bool) -> None:
        """Turn unsent rows into prepared messages: with `full_only`, only whole envelopes
        (a burst read in chunks still travels in full envelopes)."""
        size = self.relay_config.envelope_max
        ready: list[OutboxRow] = []
        for key, rows in list(staged.unsent.items()):
            cut = len(rows) - len(rows) % size if full_only else len(rows)
            if cut:
                ready.extend(rows[:cut])
                if cut == len(rows):
                    del staged.unsent[key]
                else:
                    staged.unsent[key] = rows[cut:]
        for tenant_id, messages in messages_by_tenant(ready, self.relay_config).items():
            prepared = prepare_messages(self.publisher, messages, staged.failed)
            # Serialised: the arguments are in the body now, and would double what a staged
            # row costs in memory.
            staged.messages.setdefault(tenant_id, []).extend(
                (replace(out, kwargs={}), message) for out, message in prepared
            )

    def _row(self, values: tuple[Any, ...]) -> OutboxRow:
        intern = self._interned.setdefault
        (id_, occurrence_id, scheduled_for, schedule_id, version, tenant_id, lane,
         available_at, shard) = values  # fmt: skip
        return OutboxRow(
            id_, occurrence_id, intern(scheduled_for, scheduled_for), schedule_id, version,
            intern(tenant_id, tenant_id), intern(lane, lane),
            intern(available_at, available_at), shard,
        )  # fmt: skip

    # -- step 3 --------------------------------------------------------------------------

    def publish(
        self, *, recorder: Recorder | None = None, throttle: TenantThrottle | None = None
    ) -> RelayResult:
        """Publish the staged instant (module docstring, step 3) and forget it."""
        staged, self.staged = self.staged, None
        self._interned.clear()
        result = RelayResult()
        if staged is None or not staged.rows:
            return result
        started = time.perf_counter()
        self._build(staged, full_only=False)
        # Fenced: keep the shards whose marks held since their rows were read, and take the
        # quotas (a deferral writes the outbox). The fence is then let go until the instant.
        with transaction.atomic(), connection.cursor() as cursor:
            current = shard_marks(cursor, self.leases, self.leases.fenced_shards())
            marks = {s: m for s, m in staged.marks.items() if current.get(s) == m}
            rows = [row for row in staged.rows.values() if row.shard in marks]
            failed = {i: e for i, e in staged.failed.items() if staged.rows[i].shard in marks}
            result.claimed = len(rows)
            if len(rows) < len(staged.rows):
                log.info(
                    "%d staged rows dropped (recalled or lease moved): read again",
                    len(staged.rows) - len(rows),
                )
            if throttle is not None and rows:
                rows = apply_quotas(cursor, rows, throttle, result)
        by_id = {row.id: row for row in rows}
        ordered = self._messages(staged, by_id, failed)
        ready_at, lead = time.perf_counter(), staged.instant - timezone.now()
        confirmed = publish_on_time(
            leases=self.leases, publisher=self.publisher, config=self.relay_config,
            groups=[ordered] if ordered else [], by_id=by_id, marks=marks, failed=failed,
            result=result,
        )  # fmt: skip
        log.info(
            "staged publish of %s: %d rows ready in %.2f s, %.2f s before the instant; "
            "%d messages published in %.2f s",
            staged.instant.isoformat(), len(rows), ready_at - started, lead.total_seconds(),
            len(ordered), time.perf_counter() - ready_at,
        )  # fmt: skip
        if failed:
            result.failed = len(failed)
            result.parked = record_failures(
                self.leases, failed, self.relay_config.max_publish_attempts
            )
        batch = ConfirmedBatch({i: (by_id[i], at) for i, at in confirmed.items()})
        if recorder is not None:
            recorder.submit(batch)
            self._settling[staged.instant] = (frozenset(batch.rows), False)
        else:
            record_confirmed(leases=self.leases, batch=batch)
        result.published = len(confirmed)
        count_published(batch, result)
        return result

    def _messages(
        self, staged: StagedInstant, kept: dict[int, OutboxRow], failed: dict[int, str]
    ) -> list[Prepared]:
        """The staged messages, tenants taking turns; a tenant any of whose staged rows is no
        longer kept (dropped shard, quota deferral) has its messages built again."""
        stale = {
            tenant_id
            for tenant_id, prepared in staged.messages.items()
            if not all(key in kept for message, _ in prepared for key in message.keys)
        }
        rebuilt: dict[str, list[OutgoingMessage]] = {}
        if stale:
            rebuilt = messages_by_tenant(
                [row for row in kept.values() if row.tenant_id in stale and row.id not in failed],
                self.relay_config,
            )
        per_tenant: list[list[Prepared]] = []
        for tenant_id, prepared in staged.messages.items():
            if tenant_id in stale:
                prepared = prepare_messages(self.publisher, rebuilt.get(tenant_id, []), failed)
            per_tenant.append(prepared)
        return round_robin(per_tenant)
