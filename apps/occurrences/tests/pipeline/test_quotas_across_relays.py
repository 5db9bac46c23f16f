"""A tenant's trigger-rate quota holds across relay processes (docs/decisions.md "Quotas in
the relay"): two real relays split the shard leases, the tenant's due work is spread over
shards of both, and its published rate stays within 10 % of its quota."""

from __future__ import annotations

import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from apps.occurrences.models import Occurrence, ShardLease
from apps.occurrences.tests.support.processes import ProcessStack, shared_stack_env
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule
from apps.tenants.models import Tenant

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

RATE = 10  # the tenant's trigger-rate quota, per second
SECONDS = 6  # of due work at twice the quota
TOTAL = 2 * RATE * SECONDS


def _wait(predicate, timeout_s: float, stack: ProcessStack, what: str) -> None:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if predicate():
            return
        stack.assert_alive()
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout_s} s")


def _relay_owners() -> dict[int, str]:
    return dict(
        ShardLease.objects.filter(role=ShardLease.Role.RELAY, lease_expires_at__gt=timezone.now())
        .exclude(owner="")
        .values_list("shard", "owner")
    )


def test_two_relays_hold_a_tenant_to_its_trigger_rate(
    tenant_a, queue_prefix: str, tmp_path: Path
) -> None:
    # given: two relays that have split the shards between them
    Tenant.objects.filter(pk=tenant_a.pk).update(trigger_rate_per_s=RATE)
    stack = ProcessStack(tmp_path, shared_stack_env(queue_prefix))
    stack.start_role("relay", name="relay-1")
    stack.start_role("relay", name="relay-2")
    try:
        _wait(
            lambda: sorted(Counter(_relay_owners().values()).values()) == [128, 128],
            30,
            stack,
            "relay shards split",
        )
        # and: twice the quota due every second for SECONDS seconds
        first = (timezone.now() + timedelta(seconds=8)).replace(microsecond=0)
        schedules = [
            make_schedule(tenant_a, kind=Schedule.Kind.ONE_SHOT, expression="",
                          run_at=first + timedelta(seconds=n // (2 * RATE)), name=f"q-{n}")
            for n in range(TOTAL)
        ]  # fmt: skip
        owners = _relay_owners()
        assert len({owners[s.shard] for s in schedules}) == 2  # work on shards of both relays

        # when
        stack.start_role("materialize")
        enqueued = Occurrence.objects.filter(tenant=tenant_a, enqueued_at__isnull=False)
        _wait(lambda: enqueued.count() == TOTAL, 60, stack, "all published")

        # then: after the one-second burst the bucket allows, the rate is the quota
        times = sorted(t for t in enqueued.values_list("enqueued_at", flat=True) if t)
        measured = (TOTAL - RATE) / (times[-1] - times[0]).total_seconds()
        sys.stdout.write(f"measured {measured:.2f}/s for a quota of {RATE}/s with 2 relays\n")
        assert measured == pytest.approx(RATE, rel=0.10)
        # and both relays published some of it
        assert all("relayed" in stack.log_text(name) for name in ("relay-1", "relay-2"))
        stack.assert_alive()
    finally:
        stack.stop_all()
