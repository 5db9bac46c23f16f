"""The lean-SQL floor: Tick's occurrence lifecycle written as the fewest set-based statements
on Tick's own migrated schema, so a benchmark can print Tick's PostgreSQL work per occurrence
as a ratio of what the same rows cost at least (docs/performance.md "Floor").

- materialize: per 2,000 due schedules one statement that locks them, inserts their
  occurrences and outbox rows and advances `next_run_at`;
- relay: per 20,000 outbox rows one `DELETE … RETURNING` feeding an `UPDATE … ENQUEUED`;
- claim: per occurrence one transaction (`UPDATE` RUNNING + `INSERT` attempt);
- complete: per occurrence one transaction (`UPDATE` attempt + `UPDATE` occurrence);
- with `execution_batch` K > 0, the same claim and completion once more over as many other
  rows, K occurrences per transaction (one set-based statement each): what batching claims
  and completions could buy on this schema, beside the one-at-a-time floor
  (docs/performance.md "Floor").

No broker, no Python between rows beyond the driver: each phase's PostgreSQL CPU is read
from /proc for this connection's backend and for the whole server (walwriter, checkpointer,
autovacuum included), WAL from the LSN. The rows belong to a tenant of their own, removed
afterwards.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from apps.bench.fixtures import (
    ScheduleBatch,
    bench_tenants,
    bench_tenants_delete,
    cron_definition,
)
from apps.bench.pg_profile import backend_cpu_s, profile_read
from apps.bench.processes import postgresql_cpu_s
from apps.occurrences.execution.statements import (
    ATTEMPT_ROW_TABLE,
    OCCURRENCE_ROW_TABLE,
    on_row_partitions,
)
from apps.occurrences.models import Attempt, Lane, Occurrence, attempt_open_by_key
from apps.occurrences.pipeline.partitions import partitions_ensure
from apps.schedules.models import Schedule

OCCURRENCE_TABLE = "occurrences_occurrence"
MATERIALIZE_BATCH = 2_000
RELAY_BATCH = 20_000
PHASES = ("materialize", "relay", "claim", "complete")
DELIVERY_PHASES = ("materialize", "relay")
EXECUTION_PHASES = ("claim", "complete")
BATCHED_PHASES = ("claim batched", "complete batched")

_MATERIALIZE = """
    WITH due AS (
        SELECT id, tenant_id, version, next_run_at, shard FROM schedules_schedule
         WHERE tenant_id = %(tenant)s AND state = %(active)s AND next_run_at = %(at)s
         LIMIT %(limit)s FOR UPDATE
    ),
    advance AS (
        UPDATE schedules_schedule s SET next_run_at = s.next_run_at + interval '1 day'
          FROM due WHERE s.id = due.id
    ),
    occ AS (
        INSERT INTO occurrences_occurrence
            (id, scheduled_for, schedule_id, schedule_version, tenant_id, lane, state,
             available_at, attempt_count, created_at)
        SELECT gen_random_uuid(), next_run_at, id, version, tenant_id, %(lane)s, %(scheduled)s,
               next_run_at, 0, now()
          FROM due
        RETURNING id, scheduled_for, schedule_id, schedule_version, tenant_id, available_at
    )
    INSERT INTO occurrences_dispatchoutbox
        (occurrence_id, scheduled_for, schedule_id, schedule_version, tenant_id, shard, lane,
         available_at, created_at)
    SELECT occ.id, occ.scheduled_for, occ.schedule_id, occ.schedule_version, occ.tenant_id,
           due.shard, %(lane)s, occ.available_at, now()
      FROM occ JOIN due ON due.id = occ.schedule_id
"""

_RELAY = """
    WITH sent AS (
        DELETE FROM occurrences_dispatchoutbox
         WHERE id IN (SELECT id FROM occurrences_dispatchoutbox WHERE tenant_id = %(tenant)s
                       ORDER BY id LIMIT %(limit)s)
        RETURNING occurrence_id, scheduled_for
    )
    UPDATE occurrences_occurrence o
       SET state = %(enqueued)s, enqueued_at = now(), last_enqueued_at = now()
      FROM sent WHERE o.id = sent.occurrence_id AND o.scheduled_for = sent.scheduled_for
"""

_CLAIM_OCCURRENCE = """
    UPDATE occurrences_occurrence SET state = %s, attempt_count = attempt_count + 1
     WHERE id = %s AND scheduled_for = %s AND state = %s
"""
_CLAIM_ATTEMPT = """
    INSERT INTO occurrences_attempt
        (id, scheduled_for, occurrence_id, tenant_id, attempt_no, lease_token,
         lease_expires_at, worker_id, started_at, outcome, error_class, error_message)
    VALUES (%s, %s, %s, %s, 1, %s, now() + interval '5 minutes', 'floor', now(), '', '', '')
"""
_COMPLETE_ATTEMPT = f"""
    UPDATE occurrences_attempt SET finished_at = now(), outcome = %s
     WHERE id = %s AND scheduled_for = %s AND lease_token = %s AND {attempt_open_by_key()}
"""
_COMPLETE_OCCURRENCE = """
    UPDATE occurrences_occurrence SET state = %s, finished_at = now()
     WHERE id = %s AND scheduled_for = %s AND state = %s
"""
# The batched claim and completion: the same rows and conditions as the statements above,
# for every occurrence of a batch in one statement, on the day partitions of the batch's
# rows (one day per batch here), as the worker names them: on the partitioned tables a
# statement over a set of rows is planned across every kept day's partition and costs
# several times the rows' work (docs/performance.md "Execution batched: what the floor says").
_CLAIM_BATCH = f"""
    WITH r AS (
        SELECT * FROM unnest(%(ids)s::uuid[], %(ats)s::timestamptz[], %(tenants)s::uuid[],
                             %(attempts)s::uuid[], %(tokens)s::uuid[])
            AS r(id, at, tenant_id, attempt_id, token)
    ), occ AS (
        UPDATE {OCCURRENCE_ROW_TABLE} o SET state = %(running)s, attempt_count = o.attempt_count + 1
          FROM r WHERE o.id = r.id AND o.scheduled_for = r.at AND o.state = %(enqueued)s
        RETURNING o.id, o.scheduled_for
    )
    INSERT INTO {ATTEMPT_ROW_TABLE}
        (id, scheduled_for, occurrence_id, tenant_id, attempt_no, lease_token,
         lease_expires_at, worker_id, started_at, outcome, error_class, error_message)
    SELECT r.attempt_id, r.at, r.id, r.tenant_id, 1, r.token, now() + interval '5 minutes',
           'floor', now(), '', '', ''
      FROM r JOIN occ ON occ.id = r.id AND occ.scheduled_for = r.at
    RETURNING occurrence_id
"""
_COMPLETE_BATCH = f"""
    WITH r AS (
        SELECT * FROM unnest(%(ids)s::uuid[], %(ats)s::timestamptz[], %(attempts)s::uuid[],
                             %(tokens)s::uuid[]) AS r(id, at, attempt_id, token)
    ), att AS (
        UPDATE {ATTEMPT_ROW_TABLE} a SET finished_at = now(), outcome = %(succeeded)s
          FROM r WHERE a.id = r.attempt_id AND a.scheduled_for = r.at AND a.lease_token = r.token
           AND {attempt_open_by_key("a")}
        RETURNING a.occurrence_id, a.scheduled_for
    )
    UPDATE {OCCURRENCE_ROW_TABLE} o SET state = %(succeeded_state)s, finished_at = now()
      FROM att WHERE o.id = att.occurrence_id AND o.scheduled_for = att.scheduled_for
       AND o.state = %(running)s
"""


@dataclass
class PhaseCost:
    rows: int
    seconds: float
    backend_us: float  # per row: this connection's backend
    server_us: float  # per row: the whole server (background processes included)
    wal_bytes: float  # per row


@dataclass
class FloorReport:
    occurrences: int
    executed: int
    phases: dict[str, PhaseCost]
    occurrence_hot_share: float | None
    execution_batch: int = 0  # K of the batched phases (BATCHED_PHASES); 0: not run

    def per_occurrence(self, phases: tuple[str, ...]) -> tuple[float, float]:
        """(server µs, WAL bytes) per occurrence over `phases`."""
        return (
            sum(self.phases[p].server_us for p in phases),
            sum(self.phases[p].wal_bytes for p in phases),
        )

    def lines(self) -> list[str]:
        out = [
            f"floor (lean SQL on this schema): {self.occurrences:,} occurrences delivered, "
            f"{self.executed:,} claimed and completed one transaction each"
        ]
        for name, p in self.phases.items():
            out.append(
                f"  {name:<11} {p.server_us:7.1f} µs PG CPU/occ (backend {p.backend_us:.1f}), "
                f"WAL {p.wal_bytes / 1024:5.2f} KB/occ, {p.rows:,} rows in {p.seconds:.1f} s"
            )
        delivery, delivery_wal = self.per_occurrence(DELIVERY_PHASES)
        execution, execution_wal = self.per_occurrence(EXECUTION_PHASES)
        hot = "-" if self.occurrence_hot_share is None else f"{self.occurrence_hot_share:.0%}"
        out.append(
            f"  delivery {delivery:.0f} µs + execution {execution:.0f} µs PG CPU/occ; WAL "
            f"{delivery_wal / 1024:.2f} + {execution_wal / 1024:.2f} KB/occ; occurrence "
            f"updates HOT {hot}"
        )
        if all(p in self.phases for p in BATCHED_PHASES):
            batched, batched_wal = self.per_occurrence(BATCHED_PHASES)
            out.append(
                f"  execution {self.execution_batch} at a time: {batched:.0f} µs PG CPU/occ, "
                f"WAL {batched_wal / 1024:.2f} KB/occ"
            )
        return out


def _lsn() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn()::text")
        row = cursor.fetchone()
    return str(row[0]) if row else "0/0"


def _wal_since(lsn: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)", [lsn])
        row = cursor.fetchone()
    return int(row[0]) if row else 0


class _Meter:
    """PostgreSQL CPU (backend and server) and WAL over one phase."""

    def __enter__(self) -> _Meter:
        self.lsn = _lsn()
        self.backend = backend_cpu_s()
        self.server = postgresql_cpu_s()
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.monotonic() - self.started
        self.backend = backend_cpu_s() - self.backend
        self.server = postgresql_cpu_s() - self.server
        self.wal = _wal_since(self.lsn)

    def cost(self, rows: int) -> PhaseCost:
        per = max(rows, 1)
        return PhaseCost(
            rows=rows, seconds=round(self.seconds, 2),
            backend_us=round(self.backend * 1e6 / per, 1),
            server_us=round(self.server * 1e6 / per, 1), wal_bytes=round(self.wal / per),
        )  # fmt: skip


def _load(tenant_id: uuid.UUID, count: int, at: datetime) -> None:
    now = timezone.now()
    expression = "0 0 * * *"
    definition = cron_definition(expression, precision=Schedule.Precision.STRICT, window_s=0)
    batch = ScheduleBatch()
    for _ in range(count):
        sid = uuid.uuid4()
        batch.add_schedule(
            sid, tenant_id, expression=expression, time_zone="UTC",
            precision=Schedule.Precision.STRICT, flexible_window_s=0, next_run_at=at,
            created_at=now, definition=definition,
        )  # fmt: skip
        batch.add_created_event(sid, tenant_id, now)
    with connection.cursor() as cursor:
        batch.copy(cursor)
        cursor.execute("ANALYZE schedules_schedule")


def _materialize(tenant_id: uuid.UUID, at: datetime, count: int) -> int:
    done = 0
    with connection.cursor() as cursor:
        while done < count:
            with transaction.atomic():
                cursor.execute(_MATERIALIZE, {
                    "tenant": tenant_id, "active": Schedule.State.ACTIVE, "at": at,
                    "limit": MATERIALIZE_BATCH, "lane": Lane.STRICT,
                    "scheduled": Occurrence.State.SCHEDULED,
                })  # fmt: skip
                if cursor.rowcount <= 0:
                    break
                done += cursor.rowcount
    return done


def _relay(tenant_id: uuid.UUID) -> int:
    done = 0
    with connection.cursor() as cursor:
        while True:
            with transaction.atomic():
                cursor.execute(_RELAY, {
                    "tenant": tenant_id, "limit": RELAY_BATCH,
                    "enqueued": Occurrence.State.ENQUEUED,
                })  # fmt: skip
                if cursor.rowcount <= 0:
                    return done
                done += cursor.rowcount


_Claimed = tuple[uuid.UUID, datetime, uuid.UUID, uuid.UUID]


def _claim(rows: list[tuple[uuid.UUID, datetime, uuid.UUID]]) -> list[_Claimed]:
    claimed: list[_Claimed] = []
    with connection.cursor() as cursor:
        for occurrence_id, scheduled_for, tenant_id in rows:
            attempt_id, token = uuid.uuid4(), uuid.uuid4()
            with transaction.atomic():
                cursor.execute(_CLAIM_OCCURRENCE, [
                    Occurrence.State.RUNNING, occurrence_id, scheduled_for,
                    Occurrence.State.ENQUEUED,
                ])  # fmt: skip
                cursor.execute(
                    _CLAIM_ATTEMPT, [attempt_id, scheduled_for, occurrence_id, tenant_id, token]
                )
            claimed.append((occurrence_id, scheduled_for, attempt_id, token))
    return claimed


def _complete(claimed: list[_Claimed]) -> None:
    with connection.cursor() as cursor:
        for occurrence_id, scheduled_for, attempt_id, token in claimed:
            with transaction.atomic():
                cursor.execute(
                    _COMPLETE_ATTEMPT,
                    [Attempt.Outcome.SUCCEEDED, attempt_id, scheduled_for, token],
                )
                cursor.execute(_COMPLETE_OCCURRENCE, [
                    Occurrence.State.SUCCEEDED, occurrence_id, scheduled_for,
                    Occurrence.State.RUNNING,
                ])  # fmt: skip


def _claim_batched(rows: list[tuple[uuid.UUID, datetime, uuid.UUID]], batch: int) -> list[_Claimed]:
    claimed: list[_Claimed] = []
    now = timezone.now()
    with connection.cursor() as cursor:
        for start in range(0, len(rows), batch):
            chunk = rows[start : start + batch]
            attempts = [uuid.uuid4() for _ in chunk]
            tokens = [uuid.uuid4() for _ in chunk]
            with transaction.atomic():
                cursor.execute(on_row_partitions(_CLAIM_BATCH, chunk[0][1], now), {
                    "ids": [r[0] for r in chunk], "ats": [r[1] for r in chunk],
                    "tenants": [r[2] for r in chunk], "attempts": attempts, "tokens": tokens,
                    "running": Occurrence.State.RUNNING, "enqueued": Occurrence.State.ENQUEUED,
                })  # fmt: skip
                opened = {row[0] for row in cursor.fetchall()}
            claimed += [
                (r[0], r[1], a, t)
                for r, a, t in zip(chunk, attempts, tokens, strict=True)
                if r[0] in opened
            ]
    return claimed


def _complete_batched(claimed: list[_Claimed], batch: int) -> int:
    """Returns how many occurrences the batches moved to SUCCEEDED."""
    done = 0
    now = timezone.now()
    with connection.cursor() as cursor:
        for start in range(0, len(claimed), batch):
            chunk = claimed[start : start + batch]
            with transaction.atomic():
                cursor.execute(on_row_partitions(_COMPLETE_BATCH, chunk[0][1], now), {
                    "ids": [c[0] for c in chunk], "ats": [c[1] for c in chunk],
                    "attempts": [c[2] for c in chunk], "tokens": [c[3] for c in chunk],
                    "succeeded": Attempt.Outcome.SUCCEEDED,
                    "succeeded_state": Occurrence.State.SUCCEEDED,
                    "running": Occurrence.State.RUNNING,
                })  # fmt: skip
                done += max(cursor.rowcount, 0)
    return done


def _execute_phases(
    rows: list[tuple[uuid.UUID, datetime, uuid.UUID]], executed: int, batch: int
) -> dict[str, PhaseCost]:
    """Claim and complete the first `executed` rows one at a time; with `batch` > 0, the next
    `executed` rows `batch` at a time."""
    costs: dict[str, PhaseCost] = {}
    with _Meter() as meter:
        claimed = _claim(rows[:executed])
    costs["claim"] = meter.cost(len(claimed))
    with _Meter() as meter:
        _complete(claimed)
    costs["complete"] = meter.cost(len(claimed))
    if batch > 0:
        with _Meter() as meter:
            claimed = _claim_batched(rows[executed:], batch)
        costs["claim batched"] = meter.cost(len(claimed))
        with _Meter() as meter:
            completed = _complete_batched(claimed, batch)
        costs["complete batched"] = meter.cost(completed)
    return costs


def bench_floor(
    *,
    occurrences: int = 20_000,
    executed: int = 2_000,
    execution_batch: int = 0,
    log: Callable[[str], object] | None = None,
) -> FloorReport:
    """Run the lean lifecycle over `occurrences` rows (claim and complete over the first
    `executed` of them one at a time, and with `execution_batch` > 0 over as many more
    `execution_batch` at a time); everything is removed afterwards."""
    say = log or (lambda message: None)
    # An instant a day ahead: no real materializer's window reaches it during the floor.
    at = (timezone.now() + timedelta(days=1)).replace(second=0, microsecond=0)
    partitions_ensure([at.date(), (at + timedelta(days=1)).date()])
    tenant_ids = bench_tenants(f"floor-{uuid.uuid4().hex[:8]}", 1)
    tenant_id = tenant_ids[0]
    try:
        say(f"floor: loading {occurrences:,} schedules…")
        _load(tenant_id, occurrences, at)
        costs: dict[str, PhaseCost] = {}
        before = profile_read().tables.get(OCCURRENCE_TABLE)
        with _Meter() as meter:
            made = _materialize(tenant_id, at, occurrences)
        costs["materialize"] = meter.cost(made)
        with _Meter() as meter:
            relayed = _relay(tenant_id)
        costs["relay"] = meter.cost(relayed)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, scheduled_for, tenant_id FROM occurrences_occurrence "
                "WHERE tenant_id = %s AND scheduled_for = %s LIMIT %s",
                [tenant_id, at, executed * (2 if execution_batch > 0 else 1)],
            )
            rows = cursor.fetchall()
        costs.update(_execute_phases(rows, executed, execution_batch))
        after = profile_read().tables.get(OCCURRENCE_TABLE)
        hot = None
        if before is not None and after is not None and after.updated > before.updated:
            hot = (after.hot_updated - before.hot_updated) / (after.updated - before.updated)
        return FloorReport(
            made, costs["claim"].rows, costs, None if hot is None else round(hot, 3),
            execution_batch=max(execution_batch, 0),
        )  # fmt: skip
    finally:
        bench_tenants_delete(tenant_ids)


def floor_json(report: FloorReport) -> dict[str, object]:
    return asdict(report)
