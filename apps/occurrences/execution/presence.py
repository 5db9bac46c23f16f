"""Live worker capacity, and the share of it one tenant may hold while others wait (the
claim's step c, claim.py; docs/decisions.md "No tenant can starve another").

1. Each worker's main process announces itself: `presence_beat` upserts its
   WorkerPresence(hostname, slots = the pool's concurrency, seen_at) at start and every
   TICK_WORKER_PRESENCE_INTERVAL_S from a `PresenceBeat` thread (started by tickweb/celery.py);
   a clean shutdown deletes the row (`presence_leave`). A row unseen for
   TICK_WORKER_PRESENCE_TTL_S is not live, so a killed or frozen worker drops out by itself;
   rows unseen for a day are forgotten. `seen_at` is written and judged by the database clock
   only, so a worker's skewed clock cannot keep it alive or age it early.
2. Capacity = TICK_WORKER_SLOTS when set (> 0), else the sum of the live rows' slots: one
   query over a table of one row per worker, read at most every CAPACITY_CACHE_S per
   process. None when no worker is live: the capacity is unknown.
3. `tenant_slot_limit` = max(1, floor(capacity x TICK_TENANT_SLOT_SHARE)), or None (no share
   limit, `Tenant.max_running` alone) while the capacity is unknown: below it a tenant claims
   without asking anything more.
4. The share is work-conserving: at or above it, a tenant is held back only while another
   tenant has claimable work waiting *now* (open ENQUEUED occurrences: published, not yet
   claimed, including those deferred by this very share) - a tenant that merely ran recently
   does not contend. Its limit is then its max-min (water-filling) allocation of the capacity
   over the waiting tenants and itself, each other tenant's demand being what it runs plus
   what it has waiting (`fair_limit`). *Running* counts worker slots: one per distinct
   worker id among the tenant's live attempts (an envelope run's attempts share one;
   docs/decisions.md "A tenant's running work counted in worker slots"). Only live attempts
   count: an open attempt whose lease expired, or whose worker's presence row went stale
   (killed, frozen), holds no slot. One snapshot query answers for every tenant at once
   (the open-attempt partial index and the open-occurrence partial index), reading at most
   CONTENTION_ROWS rows of each (below), read at most every CONTENTION_CACHE_S per process
   and only by a claim at or above its share.
5. Strict capacity is reserved at the workers too: *recovery work* - a run in the catch-up
   lane (misfire catch-up, a stale fire-once, a backfill) or a retry (attempt 2 on) - may
   hold at most the slots left once TICK_STRICT_RESERVED_SHARE of the live capacity is kept
   for on-time runs (`recovery_slot_limit`), and on each worker at most the slots left once
   the same share of that worker's announced slots is kept; beyond either its claim is
   deferred like an over-share one. Per worker because each worker holds messages it has
   not started: with quorum queues Celery's prefetch applies per queue, so a worker takes
   up to its prefetch from *every* lane queue, and an on-time message it took while recovery
   runs held all its slots waited behind them beside another worker's free slots. Counted
   fresh under one advisory lock by each recovery claim (claim.py): live attempts only.
6. On-time work goes first within a tenant's share too (lane priority): an on-time claim (a
   first attempt outside the catch-up lane) counts only the tenant's live on-time attempts,
   and is held only by other tenants' on-time work waiting - recovery work of its own or of
   others cannot use the slots step 5 keeps for on-time runs, so it does not contend for
   them. A recovery claim counts everything, as in step 4. docs/decisions.md "Strict
   capacity at the workers".
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection

from apps.occurrences.models import Lane, Occurrence

log = logging.getLogger(__name__)

# A share needs no fresher figure: workers come and go over seconds, and a claim per
# message must not cost a query of its own.
CAPACITY_CACHE_S = 2.0

_capacity_cache: tuple[float, int | None] | None = None  # (expires, monotonic clock; value)

# A held tenant's claims see another tenant's work waiting within this; a busy worker
# process asks the database at most once per span.
CONTENTION_CACHE_S = 1.0


@dataclass(frozen=True)
class Contention:
    """Per tenant: worker slots its live attempts hold and occurrences waiting to be claimed
    (step 4); the on-time part of each (a first attempt outside the catch-up lane) apart, for
    on-time claims (step 6). Waiting counts stop at the capacity (CONTENTION_WAITING_CAP)."""

    running: dict[uuid.UUID, int]
    waiting: dict[uuid.UUID, int]
    running_on_time: dict[uuid.UUID, int] = field(default_factory=dict)
    waiting_on_time: dict[uuid.UUID, int] = field(default_factory=dict)

    @property
    def running_total(self) -> int:
        return sum(self.running.values())

    def on_time(self) -> Contention:
        """The contention an on-time claim answers to: on-time work only."""
        return Contention(running=self.running_on_time, waiting=self.waiting_on_time)


_contention_cache: tuple[float, Contention] | None = None  # (expires, monotonic clock; value)


def presence_beat(*, hostname: str, slots: int) -> None:
    """Mark this worker live with `slots` slots; forget workers gone for a day."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO occurrences_workerpresence (hostname, slots, seen_at)
            VALUES (%s, %s, now())
            ON CONFLICT (hostname) DO UPDATE SET slots = excluded.slots, seen_at = excluded.seen_at
            """,
            [hostname[:200], slots],
        )
        cursor.execute(
            "DELETE FROM occurrences_workerpresence WHERE seen_at < now() - interval '1 day'"
        )


def presence_leave(*, hostname: str) -> None:
    """This worker is shutting down cleanly: its slots stop counting at once."""
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM occurrences_workerpresence WHERE hostname = %s", [hostname[:200]]
        )


def live_capacity() -> int | None:
    """Worker slots in total (step 2); None while no worker is live."""
    global _capacity_cache
    if settings.TICK_WORKER_SLOTS > 0:
        return int(settings.TICK_WORKER_SLOTS)
    cached = _capacity_cache
    if cached is not None and cached[0] > time.monotonic():
        return cached[1]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT sum(slots) FROM occurrences_workerpresence "
            "WHERE seen_at > now() - make_interval(secs => %s)",
            [settings.TICK_WORKER_PRESENCE_TTL_S],
        )
        row = cursor.fetchone()
    capacity = int(row[0]) if row and row[0] else None
    _capacity_cache = (time.monotonic() + CAPACITY_CACHE_S, capacity)
    return capacity


def capacity_forget() -> None:
    """Drop this process's cached capacity (tests that change the presence rows)."""
    global _capacity_cache
    _capacity_cache = None


def tenant_slot_limit() -> int | None:
    """The most worker slots one tenant may hold (step 3); None = no share limit."""
    capacity = live_capacity()
    if capacity is None:
        return None
    return max(1, math.floor(capacity * settings.TICK_TENANT_SLOT_SHARE))


# An open attempt holds a live slot while its lease runs and its worker has not gone
# stale (a worker without a presence row - never announced, or left cleanly - is judged by
# the lease alone). worker_id is "<hostname>:<pid>" (tasks.py).
LIVE_ATTEMPT = """
    a.finished_at IS NULL AND a.lease_expires_at > now()
    AND NOT EXISTS (
        SELECT 1 FROM occurrences_workerpresence p
        WHERE left(a.worker_id, length(p.hostname) + 1) = p.hostname || ':'
          AND p.seen_at <= now() - make_interval(secs => %(presence_ttl_s)s)
    )
"""

# The snapshot reads a bounded number of rows, whatever the backlog (step 4): at most
# CONTENTION_ROWS open attempts, and at most CONTENTION_ROWS of the oldest due open
# occurrences through the open-occurrence partial index (scheduled_for order). Per tenant
# the waiting count is capped at the capacity: a demand beyond it shares the same max-min
# allocation (`water_fill` gives it no more than the capacity). A tenant whose waiting work
# is all younger than the oldest CONTENTION_ROWS due rows is not seen until they drain: the
# work waiting longest is always seen (deferred work keeps its instant and grows older), and
# an unseen tenant can only make the share more lenient, never defer work beside a free slot.
CONTENTION_ROWS = 20_000

_CONTENTION = f"""
    WITH open_attempts AS (
        SELECT a.tenant_id, a.occurrence_id, a.scheduled_for, a.attempt_no, a.worker_id
        FROM occurrences_attempt a
        WHERE {LIVE_ATTEMPT}
        LIMIT %(rows)s
    ),
    running AS (
        SELECT a.tenant_id, count(DISTINCT a.worker_id) AS n,
               count(DISTINCT a.worker_id)
                   FILTER (WHERE a.attempt_no = 1 AND o.lane <> %(catchup_lane)s) AS on_time
        FROM open_attempts a
        JOIN occurrences_occurrence o
            ON o.id = a.occurrence_id AND o.scheduled_for = a.scheduled_for
        GROUP BY a.tenant_id
    ),
    due AS (
        SELECT o.tenant_id, o.state, o.lane, o.attempt_count, o.enqueued_at
        FROM occurrences_occurrence o
        WHERE o.finished_at IS NULL AND o.scheduled_for <= now() + interval '1 minute'
        ORDER BY o.scheduled_for
        LIMIT %(rows)s
    ),
    waiting AS (
        SELECT d.tenant_id, least(count(*), %(cap)s) AS n,
               least(count(*) FILTER (WHERE d.attempt_count = 0
                                        AND d.lane <> %(catchup_lane)s), %(cap)s) AS on_time
        FROM due d WHERE d.state = %(enqueued)s AND d.enqueued_at IS NOT NULL
        GROUP BY d.tenant_id
    )
    SELECT coalesce(r.tenant_id, w.tenant_id), coalesce(r.n, 0), coalesce(w.n, 0),
           coalesce(r.on_time, 0), coalesce(w.on_time, 0)
    FROM running r FULL JOIN waiting w ON w.tenant_id = r.tenant_id
"""


def contention() -> Contention:
    """Live running and waiting work per tenant (step 4), cached CONTENTION_CACHE_S."""
    global _contention_cache
    cached = _contention_cache
    if cached is not None and cached[0] > time.monotonic():
        return cached[1]
    capacity = live_capacity()
    with connection.cursor() as cursor:
        cursor.execute(_CONTENTION, {
            "presence_ttl_s": settings.TICK_WORKER_PRESENCE_TTL_S,
            "enqueued": Occurrence.State.ENQUEUED, "catchup_lane": Lane.CATCHUP,
            "rows": CONTENTION_ROWS, "cap": max(1, capacity or 0),
        })  # fmt: skip
        rows = cursor.fetchall()
    found = Contention(
        running={t: int(r) for t, r, _, _, _ in rows if r},
        waiting={t: int(w) for t, _, w, _, _ in rows if w},
        running_on_time={t: int(r) for t, _, _, r, _ in rows if r},
        waiting_on_time={t: int(w) for t, _, _, _, w in rows if w},
    )
    _contention_cache = (time.monotonic() + CONTENTION_CACHE_S, found)
    return found


def water_fill(capacity: float, demands: dict[uuid.UUID, float]) -> dict[uuid.UUID, float]:
    """Max-min fair allocation of `capacity` over `demands`: the smallest demands are met in
    full, the rest share what is left equally."""
    allocation: dict[uuid.UUID, float] = {}
    remaining = float(capacity)
    ordered = sorted(demands.items(), key=lambda item: item[1])
    for position, (tenant_id, demand) in enumerate(ordered):
        fair = remaining / (len(ordered) - position)
        allocation[tenant_id] = min(demand, fair)
        remaining -= allocation[tenant_id]
    return allocation


def fair_limit(tenant_id: uuid.UUID, capacity: int, snapshot: Contention) -> int | None:
    """The most live slots `tenant_id` may hold now (step 4); None = no limit: no other
    tenant has work waiting."""
    others = {
        other: snapshot.running.get(other, 0) + waiting
        for other, waiting in snapshot.waiting.items()
        if other != tenant_id and waiting > 0
    }
    if not others:
        return None
    demands: dict[uuid.UUID, float] = {**others, tenant_id: math.inf}
    return max(1, math.floor(water_fill(capacity, demands)[tenant_id]))


def recovery_slot_limit(capacity: int) -> int:
    """The most live attempts recovery work may hold (step 5): the slots left once
    TICK_STRICT_RESERVED_SHARE of the capacity is kept for on-time runs; at least 1."""
    return max(1, math.floor(capacity * (1 - settings.TICK_STRICT_RESERVED_SHARE)))


def worker_host(worker_id: str) -> str:
    """The hostname of the worker an attempt's `worker_id` ("<hostname>:<pid>", tasks.py)
    names: its presence row's key (step 1)."""
    return worker_id.rsplit(":", 1)[0][:200]


def contention_forget() -> None:
    """Drop this process's cached contention answer (tests that change the rows)."""
    global _contention_cache
    _contention_cache = None


class PresenceBeat(threading.Thread):
    """Step 1 in a worker's main process: beats until `stop`, then removes the worker's row.

    Each beat opens and closes its own database connection, so none is open in this thread
    when the pool forks a new child, and an outage costs one skipped beat, not the thread."""

    def __init__(self, *, hostname: str, slots: int, interval_s: float) -> None:
        super().__init__(name="tick-worker-presence", daemon=True)
        self.hostname, self.slots, self.interval_s = hostname, slots, interval_s
        self.stopped = threading.Event()

    def run(self) -> None:
        while True:
            self._guarded(lambda: presence_beat(hostname=self.hostname, slots=self.slots))
            if self.stopped.wait(self.interval_s):
                break
        self._guarded(lambda: presence_leave(hostname=self.hostname))

    def stop(self, timeout_s: float = 5.0) -> None:
        self.stopped.set()
        self.join(timeout_s)

    def _guarded(self, write: Callable[[], None]) -> None:
        try:
            write()
        except Exception:  # noqa: BLE001 - a missed beat only ages the row; keep beating
            log.warning("worker presence of %s not written", self.hostname, exc_info=True)
        finally:
            connection.close()
