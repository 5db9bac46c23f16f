"""Renewable shard leases with a fencing generation (docs/architecture.md "Sharding and leases").

Each materializer (and relay) process holds a fair share of the N logical shards:
1. `LeaseSet.refresh` renews the unexpired leases its owner holds (a lease someone else took
   over no longer matches and is dropped), marks itself a live member, counts live members,
   releases shards above its fair share and takes expired or free ones up to it (`FOR UPDATE
   SKIP LOCKED`, generation + 1).
2. Work is fenced: `fenced_shards` runs inside the caller's write transaction and locks the
   lease rows `FOR KEY SHARE` while checking (owner, generation, expiry). Every change of
   hands (take, release, `relay_shard_barrier`) locks the row `FOR UPDATE` first, which
   conflicts with it: it waits for (or, taking, skips) the in-flight batch, and every later
   batch of the stale process finds nothing to work on. A renewal (`extend`, `_renew`) only
   moves the expiry: a plain UPDATE of non-key columns takes `FOR NO KEY UPDATE`, which
   does not conflict, so the heartbeat never waits for its own process's fenced work
   (docs/decisions.md "Renewals pass the fence, changes of hands wait"). Expiry is judged by
   the database clock only.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass, field

from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper

from apps.occurrences.models import ShardLease
from apps.occurrences.observability import metrics

log = logging.getLogger(__name__)


# A release changes hands: the rows are locked FOR UPDATE first (in shard order), so it waits
# for fenced work in flight on them; the UPDATE alone (no key column) would pass the fence.
_RELEASE_ALL = """
    UPDATE occurrences_shardlease SET owner = '', lease_expires_at = NULL
    WHERE id IN (
        SELECT id FROM occurrences_shardlease WHERE role = %s AND owner = %s
        ORDER BY shard FOR UPDATE
    )
"""
_RELEASE_SHARDS = """
    UPDATE occurrences_shardlease SET owner = '', lease_expires_at = NULL
    WHERE id IN (
        SELECT id FROM occurrences_shardlease WHERE role = %s AND owner = %s AND shard = ANY(%s)
        ORDER BY shard FOR UPDATE
    )
"""


@dataclass
class LeaseSet:
    role: str
    owner: str
    shards_total: int
    ttl_s: int
    held: dict[int, int] = field(default_factory=dict)  # shard -> generation

    # Serialises `refresh` and `extend` (the heartbeat's thread): two UPDATEs of the same
    # lease rows in different orders could deadlock.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def refresh(self) -> dict[int, int]:
        """Step 1 of the module docstring, in one transaction; returns shard -> generation."""
        with self._lock:
            return self._refresh()

    def extend(self) -> int:
        """Push back the expiry of the leases still held (same owner and generation, not
        expired); returns how many. Takes and releases nothing: that is `refresh`'s."""
        held = dict(self.held)
        if not held:
            return 0
        with self._lock, connection.cursor() as cursor:
            cursor.execute(
                """
                UPDATE occurrences_shardlease l
                SET lease_expires_at = now() + make_interval(secs => %s)
                FROM unnest(%s::int[], %s::bigint[]) AS h(shard, generation)
                WHERE l.role = %s AND l.owner = %s AND l.shard = h.shard
                  AND l.generation = h.generation AND l.lease_expires_at > now()
                """,
                [self.ttl_s, list(held), list(held.values()), self.role, self.owner],
            )
            return int(cursor.rowcount)

    def _refresh(self) -> dict[int, int]:
        with transaction.atomic(), connection.cursor() as cursor:
            self._ensure_lease_rows(cursor)
            held = self._renew(cursor)
            fair_share = math.ceil(self.shards_total / (self._other_members(cursor) + 1))
            if len(held) > fair_share:
                self._release_extra(cursor, held, sorted(held)[fair_share:])
            elif len(held) < fair_share:
                self._take_free(cursor, held, fair_share - len(held))
        self.held = held
        return held

    def _ensure_lease_rows(self, cursor: CursorWrapper) -> None:
        cursor.execute(
            """
            INSERT INTO occurrences_shardlease (role, shard, owner, generation)
            SELECT %s, g, '', 0 FROM generate_series(0, %s - 1) AS g
            ON CONFLICT (role, shard) DO NOTHING
            """,
            [self.role, self.shards_total],
        )

    def _renew(self, cursor: CursorWrapper) -> dict[int, int]:
        # Renew every unexpired lease this owner (host:pid) holds; one taken over by
        # another owner no longer matches and drops out.
        cursor.execute(
            """
            UPDATE occurrences_shardlease
            SET lease_expires_at = now() + make_interval(secs => %s)
            WHERE role = %s AND owner = %s AND lease_expires_at > now()
            RETURNING shard, generation
            """,
            [self.ttl_s, self.role, self.owner],
        )
        return {shard: generation for shard, generation in cursor.fetchall()}

    def _other_members(self, cursor: CursorWrapper) -> int:
        """Mark this process a live member; count the other live ones."""
        cursor.execute(
            """
            INSERT INTO occurrences_leasemember (role, owner, seen_at)
            VALUES (%s, %s, now())
            ON CONFLICT (role, owner) DO UPDATE SET seen_at = excluded.seen_at
            """,
            [self.role, self.owner],
        )
        # Members of processes gone for a day are forgotten (the table stays tiny).
        cursor.execute(
            "DELETE FROM occurrences_leasemember "
            "WHERE role = %s AND seen_at < now() - interval '1 day'",
            [self.role],
        )
        # Live members, whether or not they hold a shard yet (a newcomer holds none).
        cursor.execute(
            "SELECT count(*) FROM occurrences_leasemember "
            "WHERE role = %s AND owner <> %s AND seen_at > now() - make_interval(secs => %s)",
            [self.role, self.owner, self.ttl_s],
        )
        row = cursor.fetchone()
        return int(row[0]) if row else 0

    def _release_extra(self, cursor: CursorWrapper, held: dict[int, int], extra: list[int]) -> None:
        cursor.execute(_RELEASE_SHARDS, [self.role, self.owner, extra])
        for shard in extra:
            held.pop(shard)

    def _take_free(self, cursor: CursorWrapper, held: dict[int, int], wanted: int) -> None:
        """Take up to `wanted` expired or free shards (generation + 1) into `held`. The FOR
        UPDATE conflicts with the fence's FOR KEY SHARE: a shard whose previous owner's fenced
        work is still in flight is skipped, and taken by a later refresh once it committed."""
        cursor.execute(
            """
            UPDATE occurrences_shardlease l
            SET owner = %s, generation = l.generation + 1,
                lease_expires_at = now() + make_interval(secs => %s)
            FROM (
                SELECT id, owner AS previous FROM occurrences_shardlease
                WHERE role = %s AND (lease_expires_at IS NULL OR lease_expires_at <= now())
                ORDER BY shard
                LIMIT %s
                FOR UPDATE SKIP LOCKED
            ) AS free
            WHERE l.id = free.id
            RETURNING l.shard, l.generation, free.previous
            """,
            [self.owner, self.ttl_s, self.role, wanted],
        )
        taken = cursor.fetchall()
        held.update({shard: generation for shard, generation, _ in taken})
        # An expired lease still naming another owner: that process died or froze.
        takeovers = sum(1 for *_, previous in taken if previous not in ("", self.owner))
        if takeovers:
            metrics.lease_takeovers.labels(role=self.role).inc(takeovers)

    def release(self) -> None:
        """Give the shards back at shutdown so others need not wait for expiry."""
        with connection.cursor() as cursor:
            cursor.execute(_RELEASE_ALL, [self.role, self.owner])
            cursor.execute(
                "DELETE FROM occurrences_leasemember WHERE role = %s AND owner = %s",
                [self.role, self.owner],
            )
        self.held = {}

    def fenced_shards(self) -> list[int]:
        """Shards still held, locked FOR KEY SHARE until the caller's transaction ends: a change
        of hands waits for (or skips) them, a renewal of their expiry does not."""
        if not self.held:
            return []
        with connection.cursor() as cursor:
            cursor.execute(
                """
                SELECT l.shard FROM occurrences_shardlease l
                JOIN unnest(%s::int[], %s::bigint[]) AS h(shard, generation)
                  ON l.shard = h.shard AND l.generation = h.generation
                WHERE l.role = %s AND l.owner = %s AND l.lease_expires_at > now()
                FOR KEY SHARE OF l
                """,
                [list(self.held), list(self.held.values()), self.role, self.owner],
            )
            return sorted(row[0] for row in cursor.fetchall())


def relay_shard_barrier(shard: int) -> None:
    """Wait for the relay step in flight on `shard`, and hold off the next one, until the
    caller's transaction ends.

    For schedule changes that remove outbox rows (update, pause, cancel): the relay reads
    outbox rows without row locks under its FOR KEY SHARE lease fence, so locking the shard's
    relay lease row FOR UPDATE (which conflicts with FOR KEY SHARE; the UPDATE alone, of a
    non-key column, would not) is what makes "not yet published" a stable fact until commit.
    The update counts the recall in `recalls`: rows a relay staged ahead of their instant are
    published only if it has not moved since.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE occurrences_shardlease SET recalls = recalls + 1 WHERE id = ("
            "SELECT id FROM occurrences_shardlease WHERE role = %s AND shard = %s FOR UPDATE)",
            [ShardLease.Role.RELAY, shard],
        )


class LeaseHeartbeat(threading.Thread):
    """Extends this process's leases every ttl/3 on its own connection, so that one unit of
    work running longer than the TTL (a 500k burst's publish and record) does not lose its
    shards midway: losing them makes the next owner publish the same rows again. Nothing
    else changes hands here; every write is still fenced."""

    def __init__(self, leases: LeaseSet) -> None:
        super().__init__(name=f"{leases.role}-lease-heartbeat", daemon=True)
        self.leases = leases
        self._stopped = threading.Event()

    def run(self) -> None:
        try:
            while not self._stopped.wait(max(self.leases.ttl_s / 3, 0.5)):
                try:
                    self.leases.extend()
                except Exception:  # noqa: BLE001 - the loop's refresh is the fallback
                    log.warning("could not extend %s leases", self.leases.role, exc_info=True)
                    connection.close()
        finally:
            connection.close()

    def stop(self) -> None:
        self._stopped.set()
        self.join(timeout=5)
