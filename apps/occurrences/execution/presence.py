"""Live worker capacity, and the share of it one tenant may hold while others contend (the
claim's step c, claim.py).

1. Each worker's main process announces itself: `presence_beat` upserts its
   WorkerPresence(hostname, slots = the pool's concurrency, seen_at) at start and every
   TICK_WORKER_PRESENCE_INTERVAL_S from a `PresenceBeat` thread (started by tickweb/celery.py);
   a clean shutdown deletes the row (`presence_leave`). A row unseen for
   TICK_WORKER_PRESENCE_TTL_S is not live, so a killed worker drops out by itself; rows unseen
   for a day are forgotten. `seen_at` is written and judged by the database clock only, so a
   worker's skewed clock cannot keep it alive or age it early.
2. Capacity = TICK_WORKER_SLOTS when set (> 0), else the sum of the live rows' slots: one
   query over a table of one row per worker, read at most every CAPACITY_CACHE_S per
   process. None when no worker is live: the capacity is unknown.
3. `tenant_slot_limit` = max(1, floor(capacity x TICK_TENANT_SLOT_SHARE)), or None (no share
   limit, `Tenant.max_running` alone) while the capacity is unknown. The claim compares it
   with the tenant's open attempts under the tenant lock (locks.py).
4. The share is work-conserving: it binds only while another tenant contends for slots, i.e.
   started an attempt within the last TICK_FAIR_SHARE_WINDOW_S or has one open now. A tenant
   alone may use every slot (its burst fans out over the whole pool); a tenant that runs every
   minute counts all the time, so a flood is held to its share from its first claim of the
   minute, not only once the quiet tenants already hold slots (slots are not preempted).
   Every claim that opens an attempt records it in TenantActivity (`tenant_activity_mark`,
   under the tenant lock): the database rewrites a row at most every ACTIVITY_WRITE_EVERY_S,
   and a process sends the write for a tenant at most that often, so a recorded start lags
   the true last one by at most twice that — the read looks back as much longer, so no start
   within the window is missed. Only a claim at or above its share asks `others_contend`:
   one query over that table and the open attempts' partial index, answered for every tenant
   at once and read at most every CONTENTION_CACHE_S per process. Both are judged by the
   database clock, like step 1.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable

from django.conf import settings
from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper

log = logging.getLogger(__name__)

# A share needs no fresher figure: workers come and go over seconds, and a claim per
# message must not cost a query of its own.
CAPACITY_CACHE_S = 2.0

_capacity_cache: tuple[float, int | None] | None = None  # (expires, monotonic clock; value)

# A tenant's activity row needs no fresher figure against a window of a minute, and the
# claim path writes it: at most one real write per tenant per this many seconds, and one
# statement per tenant per process (the rest of a claim's cost stays as it was).
ACTIVITY_WRITE_EVERY_S = 5
# A recorded start lags the tenant's true last start by at most this (module docstring).
ACTIVITY_LAG_S = 2 * ACTIVITY_WRITE_EVERY_S
# A flood's claims see a quiet tenant's first start within this; a busy worker process asks
# the database at most once per span.
CONTENTION_CACHE_S = 1.0

_contention_cache: tuple[float, frozenset[uuid.UUID]] | None = None  # (expires; active ids)
_activity_sent: dict[uuid.UUID, float] = {}  # tenant -> monotonic time of a committed write


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
    """The most attempts one tenant may have running (step 3); None = no share limit."""
    capacity = live_capacity()
    if capacity is None:
        return None
    return max(1, math.floor(capacity * settings.TICK_TENANT_SLOT_SHARE))


def tenant_activity_mark(cursor: CursorWrapper, tenant_id: uuid.UUID) -> None:
    """The tenant just opened an attempt (step 4; the claim holds the tenant lock): record it,
    unless this process sent it, or its row was written, within ACTIVITY_WRITE_EVERY_S."""
    sent_at = time.monotonic()
    if sent_at - _activity_sent.get(tenant_id, -math.inf) < ACTIVITY_WRITE_EVERY_S:
        return
    cursor.execute(
        """
        INSERT INTO occurrences_tenantactivity AS seen (tenant_id, last_started_at)
        VALUES (%s, now())
        ON CONFLICT (tenant_id) DO UPDATE SET last_started_at = excluded.last_started_at
        WHERE seen.last_started_at < excluded.last_started_at - make_interval(secs => %s)
        """,
        [tenant_id, ACTIVITY_WRITE_EVERY_S],
    )
    # Remembered once the claim commits: a rolled-back write must not silence the next one.
    transaction.on_commit(lambda: _activity_remember(tenant_id, sent_at))


def _activity_remember(tenant_id: uuid.UUID, sent_at: float) -> None:
    if len(_activity_sent) >= 10_000:  # long-gone tenants: forgetting costs a write each
        _activity_sent.clear()
    _activity_sent[tenant_id] = sent_at


def active_tenants() -> frozenset[uuid.UUID]:
    """Tenants contending for slots (step 4): up to two that started an attempt within the
    window and up to two with an attempt open now — enough to tell whether any tenant other
    than a given one is among them."""
    global _contention_cache
    cached = _contention_cache
    if cached is not None and cached[0] > time.monotonic():
        return cached[1]
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT tenant_id FROM (
                SELECT tenant_id FROM occurrences_tenantactivity
                WHERE last_started_at > now() - make_interval(secs => %s) LIMIT 2
            ) recent
            UNION
            SELECT tenant_id FROM (
                SELECT DISTINCT tenant_id FROM occurrences_attempt
                WHERE finished_at IS NULL LIMIT 2
            ) running
            """,
            [settings.TICK_FAIR_SHARE_WINDOW_S + ACTIVITY_LAG_S],
        )
        active = frozenset(tenant_id for (tenant_id,) in cursor.fetchall())
    _contention_cache = (time.monotonic() + CONTENTION_CACHE_S, active)
    return active


def others_contend(tenant_id: uuid.UUID) -> bool:
    """Whether a tenant other than `tenant_id` contends for slots: the share binds (step 4)."""
    return any(active != tenant_id for active in active_tenants())


def contention_forget() -> None:
    """Drop this process's cached contention answer and its record of activity writes sent
    (tests that change the activity rows)."""
    global _contention_cache
    _contention_cache = None
    _activity_sent.clear()


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
