"""`manage.py bench_outage`: a control-plane outage under each misfire policy, with real
materialize, relay, reap and worker processes on a private queue prefix.

Four tenants of N every-minute strict schedules, max lateness 20 s: SKIP, FIRE_ONCE, CATCHUP
(K = 5 at 20 catch-up runs/s) and a FIRE_ONCE bystander. The processes run until the first
instant has passed; then the materializer, the relay and the reaper are SIGKILLed (the workers
stay up) for the outage, and started again. Figures: per policy the late runs expected and
made and the instants MISSED, the recovery time (restart → no instant of the outage left
unfinished), the bystander's enqueue and start lag p99 over its instants after the restart,
and reconcile's policy-breach classes.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from apps.bench.execution import Pool, _copy_every_minute, _stack, _wait_until
from apps.bench.fixtures import next_whole_minute
from apps.occurrences.audit.reconcile import POLICY_BREACHES, reconcile
from apps.occurrences.misfire import late_runs_allowed
from apps.occurrences.models import Lane, Occurrence
from apps.schedules.models import Schedule
from apps.tenants.models import Tenant

Say = Callable[[str], None]
LATENESS_S = 20
LOOPS = ("materialize", "relay", "reap")
POLICIES = (
    ("skip", Schedule.MisfirePolicy.SKIP, 0),
    ("fire_once", Schedule.MisfirePolicy.FIRE_ONCE, 0),
    ("catchup", Schedule.MisfirePolicy.CATCHUP, 5),
    ("bystander", Schedule.MisfirePolicy.FIRE_ONCE, 0),
)


@dataclass(frozen=True)
class OutagePlan:
    schedules: int = 200
    outage_s: float = 600.0
    catchup_rate: int = 20
    pool: Pool = field(default_factory=lambda: Pool(workers=2, concurrency=2))
    after_s: float = 150.0  # how long to watch the bystander after the restart


@dataclass
class OutageReport:
    plan: dict[str, Any]
    outage_from: str = ""
    restart_at: str = ""
    policies: dict[str, dict[str, int]] = field(default_factory=dict)
    recovery_s: float | None = None
    bystander: dict[str, Any] = field(default_factory=dict)
    reconcile: dict[str, int] = field(default_factory=dict)


def _p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3)


# Per schedule, over the instants observed: those late (a first attempt started beyond the max
# lateness, or in the catch-up lane; or MISSED) and of them the runs, split at the restart.
_LATE_RUNS = """
    SELECT o.schedule_id,
           count(*) FILTER (WHERE o.scheduled_for < %(restart)s AND {ran_late}),
           count(*) FILTER (WHERE o.scheduled_for < %(restart)s AND o.state = %(missed)s),
           count(*) FILTER (WHERE o.scheduled_for >= %(restart)s AND {ran_late}),
           count(*) FILTER (WHERE o.scheduled_for >= %(restart)s AND o.state = %(missed)s)
    FROM occurrences_occurrence o
    LEFT JOIN occurrences_attempt a
        ON a.occurrence_id = o.id AND a.scheduled_for = o.scheduled_for AND a.attempt_no = 1
    WHERE o.tenant_id = %(tenant)s AND o.scheduled_for >= %(since)s
      AND o.scheduled_for < %(until)s
    GROUP BY o.schedule_id
""".format(
    ran_late="(a.started_at > o.scheduled_for + make_interval(secs => %(lateness)s)"
    " OR (a.started_at IS NOT NULL AND o.lane = %(catchup_lane)s))"
)


def policy_figures(
    tenant_id: uuid.UUID,
    policy: str,
    limit: int,
    *,
    since: datetime,
    restart: datetime,
    until: datetime,
) -> dict[str, int]:
    """Per policy, over the instants due in [since, until): the late runs expected and made,
    and the instants MISSED. An instant is late by what happened to it (MISSED, or its first
    attempt started beyond the max lateness), not by when it fell due: one due a few seconds
    before the restart may still run on time, and one due after it may be made late by the
    recovery. Expected per schedule = min(the policy's allowance, its late instants);
    `late_after_restart` counts the late instants due after the restart (on-time work the
    recovery delayed: 0 when strict work is untouched)."""
    with connection.cursor() as cursor:
        cursor.execute(_LATE_RUNS, {
            "lateness": LATENESS_S, "missed": Occurrence.State.MISSED, "tenant": tenant_id,
            "since": since, "restart": restart, "until": until, "catchup_lane": Lane.CATCHUP,
        })  # fmt: skip
        rows = [tuple(int(n) for n in row[1:]) for row in cursor.fetchall()]
    allowed = late_runs_allowed(policy, limit)
    expected = [min(allowed, sum(row)) for row in rows]
    ran = [row[0] + row[2] for row in rows]
    return {
        "schedules": len(rows),
        "expected": sum(expected),
        "ran": sum(ran),
        "missed": sum(row[1] + row[3] for row in rows),
        "ran_outage_instants": sum(row[0] for row in rows),
        "late_after_restart": sum(row[2] + row[3] for row in rows),
        "schedules_off_policy": sum(1 for e, r in zip(expected, ran, strict=True) if e != r),
    }


def _outage_finished(tenant_ids: list[uuid.UUID], until: datetime) -> bool:
    return not Occurrence.objects.filter(
        tenant_id__in=tenant_ids, scheduled_for__lt=until, finished_at__isnull=True
    ).exists()


def bench_outage(plan: OutagePlan, say: Say) -> OutageReport:
    report = OutageReport(plan={**asdict(plan), "lateness_s": LATENESS_S})
    with _stack(len(POLICIES), say) as stack:
        tenants = dict(zip([name for name, _, _ in POLICIES], stack.tenant_ids, strict=True))
        Tenant.objects.filter(id=tenants["catchup"]).update(catchup_rate_per_s=plan.catchup_rate)
        stack.start(plan.pool, say)
        first = next_whole_minute(timezone.now(), 20)
        for name, policy, limit in POLICIES:
            ids = _copy_every_minute(
                tenants[name], [{}] * plan.schedules, first=first,
                end_at=first + timedelta(days=1),
            )  # fmt: skip
            Schedule.objects.filter(id__in=ids).update(
                misfire_policy=policy, catchup_limit=limit, max_lateness_s=LATENESS_S
            )
        say(f"{len(POLICIES)} x {plan.schedules} schedules, first instant {first:%H:%M:%S}")
        # The outage starts 40 s into the minute after the first instant, as in the field.
        outage_from = first + timedelta(seconds=40)
        time.sleep(max(0.0, (outage_from - timezone.now()).total_seconds()))
        for name in LOOPS:
            stack.procs.procs[name].send_signal(signal.SIGKILL)
            stack.procs.procs[name].wait()
        report.outage_from = timezone.now().isoformat()
        say(f"outage: {', '.join(LOOPS)} SIGKILLed for {plan.outage_s:.0f} s")
        time.sleep(plan.outage_s)
        for name in LOOPS:
            stack.procs.start_command(name)
        restart = timezone.now()
        report.restart_at = restart.isoformat()
        say("restarted")
        cutoff = restart - timedelta(seconds=LATENESS_S)
        # The outage's instants: due after the first one; whether each was late is read
        # from what happened to it (policy_figures).
        late_since = first + timedelta(minutes=1)
        finished = _wait_until(
            lambda: _outage_finished(stack.tenant_ids, cutoff),
            restart + timedelta(seconds=plan.after_s + 600),
        )
        recovered = (timezone.now() - restart).total_seconds()
        report.recovery_s = round(recovered, 1) if finished else None
        say(f"recovery: {report.recovery_s} s")
        watch_until = restart + timedelta(seconds=plan.after_s)
        time.sleep(max(0.0, (watch_until - timezone.now()).total_seconds()) + 15)
        for name, policy, limit in POLICIES:
            report.policies[name] = policy_figures(
                tenants[name],
                policy,
                limit,
                since=late_since,
                restart=restart,
                until=watch_until,
            )
        bystander = list(
            Occurrence.objects.filter(
                tenant_id=tenants["bystander"], scheduled_for__gte=restart,
                scheduled_for__lt=watch_until,
            ).values_list("scheduled_for", "enqueued_at", "id")
        )  # fmt: skip
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT occurrence_id, started_at FROM occurrences_attempt "
                "WHERE tenant_id = %s AND attempt_no = 1 AND scheduled_for >= %s",
                [tenants["bystander"], restart],
            )
            starts = dict(cursor.fetchall())
        report.bystander = {
            "instants": len(bystander),
            "enqueue_lag_p99_s": _p99([
                (e - s).total_seconds() for s, e, _ in bystander if e is not None
            ]),
            "start_lag_p99_s": _p99([
                (starts[i] - s).total_seconds() for s, _, i in bystander if i in starts
            ]),
            "not_started": sum(1 for _, _, i in bystander if i not in starts),
        }  # fmt: skip
        # From `first`: the fixture writes next_run_at = first, so a schedule copied in the last
        # 20 s of a minute skips the whole minute between its creation and `first` - an instant
        # its rule names but the bench never asked for, which an earlier start counted missing.
        audit = reconcile(start=first, end=watch_until)
        report.reconcile = {k: audit.counts[k] for k in (*POLICY_BREACHES, "missing", "unexpected")}
    return report


def report_lines(report: OutageReport) -> list[str]:
    lines = [f"outage from {report.outage_from}, restart {report.restart_at}"]
    for name, figures in report.policies.items():
        lines.append(f"  {name:10} {figures}")
    lines.append(f"  recovery {report.recovery_s} s; bystander {report.bystander}")
    lines.append(f"  reconcile {report.reconcile}")
    return lines
