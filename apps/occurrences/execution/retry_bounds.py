"""The bounds on re-runs and the tenant's hourly retry budget (docs/decisions.md "Retries by
error class"), shared by the completion (one retry at a time) and the reaper (set-based).

Every automatic re-run spends the budget: a retry after a failure (complete.py) and a
re-queue after a lost lease (reaper.py). A manual DLQ replay does not (replay.py): it is a
person's decision, counted in `tick_replays_total`; the retries after it spend it again.
A refused re-run sends the occurrence DEAD with the reason appended to the attempt's error
as `[not retried: …]`, counted in `tick_retries_refused_total{reason}` by its RefusalReason.

Budget rows are locked in tenant order, after the attempt rows and before the occurrence
rows (the lock order of complete.py), so completions and reapers never deadlock.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from django.db.backends.utils import CursorWrapper


class RefusalReason(StrEnum):
    """Why a re-run was refused: the `reason` label of tick_retries_refused_total."""

    ATTEMPTS = "attempts"
    DEADLINE = "deadline"
    BUDGET = "budget"


@dataclass(frozen=True)
class Refusal:
    reason: RefusalReason
    text: str  # appended to the attempt's error as `[not retried: <text>]`


def attempts_refusal(attempts: int, max_attempts: int) -> Refusal:
    return Refusal(RefusalReason.ATTEMPTS, f"attempts exhausted ({attempts} of {max_attempts})")


def deadline_refusal(deadline: datetime) -> Refusal:
    # The API's instant format (docs/api.md: RFC 3339 with `Z`): the text reaches the
    # attempt's error message.
    at = deadline.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S") + "Z"
    return Refusal(RefusalReason.DEADLINE, f"deadline {at} passed")


def budget_refusal(limit: int) -> Refusal:
    return Refusal(RefusalReason.BUDGET, f"budget of {limit} retries/hour spent")


def budget_window(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def spend_retry_budget(
    cursor: CursorWrapper, *, tenant_id: uuid.UUID, limit: int, now: datetime
) -> bool:
    """Take one retry from the tenant's budget of the current UTC hour; False when spent.
    The conditional upsert is atomic: concurrent completions never overspend."""
    if limit <= 0:
        return False
    cursor.execute(
        """
        INSERT INTO occurrences_retrybudget (tenant_id, window_start, used) VALUES (%s, %s, 1)
        ON CONFLICT (tenant_id, window_start)
        DO UPDATE SET used = occurrences_retrybudget.used + 1
        WHERE occurrences_retrybudget.used < %s
        RETURNING used
        """,
        [tenant_id, budget_window(now), limit],
    )
    return cursor.fetchone() is not None


def spend_retry_budgets(
    cursor: CursorWrapper, wanted: Mapping[uuid.UUID, tuple[int, int]], *, now: datetime
) -> dict[uuid.UUID, int]:
    """Set-based form for a batch of re-runs: `wanted` maps a tenant to (re-runs, hourly
    limit); returns how many each tenant may have (at most what is left of its budget).
    Three statements for any number of tenants: create the missing windows, lock them in
    tenant order and read what is used, add what is granted."""
    tenants = sorted(t for t, (count, limit) in wanted.items() if count > 0 and limit > 0)
    granted = dict.fromkeys(wanted, 0)
    if not tenants:
        return granted
    window = budget_window(now)
    cursor.execute(
        """
        INSERT INTO occurrences_retrybudget (tenant_id, window_start, used)
        SELECT t, %s, 0 FROM unnest(%s::uuid[]) AS t ORDER BY t
        ON CONFLICT (tenant_id, window_start) DO NOTHING
        """,
        [window, tenants],
    )
    cursor.execute(
        """
        SELECT tenant_id, used FROM occurrences_retrybudget
        WHERE window_start = %s AND tenant_id = ANY(%s::uuid[])
        ORDER BY tenant_id FOR UPDATE
        """,
        [window, tenants],
    )
    for tenant_id, used in cursor.fetchall():
        count, limit = wanted[tenant_id]
        granted[tenant_id] = max(0, min(count, limit - used))
    spent = [t for t in tenants if granted[t] > 0]
    if spent:
        cursor.execute(
            """
            UPDATE occurrences_retrybudget b SET used = b.used + g.n
            FROM unnest(%s::uuid[], %s::int[]) AS g(tenant_id, n)
            WHERE b.tenant_id = g.tenant_id AND b.window_start = %s
            """,
            [spent, [granted[t] for t in spent], window],
        )
    return granted
