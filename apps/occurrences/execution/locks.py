"""Advisory locks of the execution path, and the lookback that bounds what they guard.

Order: a transaction of this package that takes more than one lock takes them in the order
attempt row → retry-budget row → occurrence row → SCHEDULE_LOCK → TENANT_LOCK →
RECOVERY_LOCK, skipping those
it does not need (claim: occurrence → schedule → tenant; completion: attempt → budget →
occurrence → schedule; reaper: attempt → occurrence), so no cycle exists. The advisory locks
are transaction-scoped (`pg_advisory_xact_lock`): commit or rollback frees them, and a
crashed worker cannot leave one behind.
- SCHEDULE_LOCK: held by every claim of a schedule with an overlap policy (claim.py) and by
  every QUEUE_ONE completion (complete.py), so "look for a RUNNING / WAITING one, then
  transition" is atomic per schedule.
- TENANT_LOCK: held by every claim while it counts the tenant's open attempts (claim.py).
  Its second key is PostgreSQL's `uuid_hash` of the tenant id (`tenant_lock_sql`), not H(id):
  the claim takes it inside the statement that locks the occurrence row, before it knows the
  tenant in Python (docs/decisions.md "Claim and completion in fewer round trips").
- RECOVERY_LOCK: taken after TENANT_LOCK by a claim of recovery work while it counts the
  recovery work running (claim.py), so two such claims cannot both take the last slot
  outside the strict reserve.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db.backends.utils import CursorWrapper

# Advisory lock namespaces (first key of the two-int form); the second is H(id).
SCHEDULE_LOCK = 6001
TENANT_LOCK = 6002
# Held while an alert delivery counts its tenant's sends in flight (alerts/deliver.py); never
# together with the locks above.
ALERT_SENDS_LOCK = 6003
# One lock for all recovery claims (catch-up lane, retries) while they count the recovery
# work running, last in the claim's order; RECOVERY_KEY is its only value.
RECOVERY_LOCK = 6004
RECOVERY_KEY = uuid.UUID(int=0)


def lock_key(value: uuid.UUID) -> int:
    """Stable signed 32-bit H(id) for advisory locks (blake2b, like every hash in Tick)."""
    return int.from_bytes(hashlib.blake2b(value.bytes, digest_size=4).digest(), "big", signed=True)


def advisory_lock(cursor: CursorWrapper, namespace: int, value: uuid.UUID) -> None:
    """Wait for the transaction-scoped lock (namespace, H(value))."""
    cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [namespace, lock_key(value)])


def tenant_lock_sql(tenant: str) -> str:
    """SQL that waits for TENANT_LOCK of the tenant id expression `tenant` (true once held);
    every taker uses this form, so they all agree on the key."""
    return f"pg_advisory_xact_lock({TENANT_LOCK}, uuid_hash({tenant})) IS NOT NULL"


def tenant_lock(cursor: CursorWrapper, tenant_id: uuid.UUID) -> None:
    """Wait for TENANT_LOCK of `tenant_id` (the claim's step c when step a did not take it)."""
    cursor.execute(f"SELECT {tenant_lock_sql('%s::uuid')}", [tenant_id])


def overlap_lookback(now: datetime) -> datetime:
    """The oldest `scheduled_for` an overlap check under SCHEDULE_LOCK looks at: occurrences
    are partitioned by it, so the bound keeps the scan to recent partitions."""
    return now - timedelta(seconds=settings.TICK_OVERLAP_LOOKBACK_S)
