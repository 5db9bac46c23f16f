"""Reconciliation benchmark (wrapped by `manage.py bench_reconcile`).

Writes N cron schedules of one private tenant (a mix: 60 % daily at a spread minute, 35 %
hourly at a spread minute, 5 % every 30 minutes; one in ten in Europe/Berlin) with one fully
SUCCEEDED day of occurrences on a day of its own (2020-01-06, its own partition), then runs
`manage.py reconcile --tenant` over that day in a child process and reports its wall time,
rate and peak RSS (the child's, so setup buffers do not count). Everything is removed after.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.db import connection

from apps.bench.fixtures import ScheduleBatch, copy_into, copy_line
from apps.occurrences.audit.reconcile import expected_cron_instants
from apps.occurrences.models import Lane, Occurrence, occurrence_id_for
from apps.occurrences.pipeline.partitions import (
    PARTITIONED_TABLES,
    partition_name,
    partitions_ensure,
)
from apps.schedules.models import Schedule
from apps.tenants.services import tenant_create

ROOT = Path(__file__).resolve().parents[2]
DAY = datetime(2020, 1, 6, tzinfo=UTC)


@dataclass
class ReconcileBench:
    schedules: int
    occurrences: int
    setup_s: float
    reconcile_s: float
    schedules_per_s: float
    occurrences_per_s: float
    peak_rss_mib: float
    ok: bool
    counts: dict[str, int]


def _rule(n: int) -> tuple[str, str]:
    zone = "Europe/Berlin" if n % 10 == 9 else "UTC"
    bucket = n % 100
    if bucket < 60:
        return f"{n % 60} {n // 60 % 24} * * *", zone
    if bucket < 95:
        return f"{n % 60} * * * *", zone
    return f"{n % 30}/30 * * * *", zone


OCCURRENCE_COPY = (
    "COPY occurrences_occurrence (id, scheduled_for, schedule_id, schedule_version, tenant_id, "
    "lane, state, available_at, enqueued_at, attempt_count, created_at, finished_at) FROM STDIN"
)


def _definition(expression: str, zone: str) -> str:
    return json.dumps(
        {"kind": Schedule.Kind.CRON, "expression": expression, "time_zone": zone,
         "dst_gap": Schedule.DstGap.SKIP, "dst_fold": Schedule.DstFold.FIRST}
    )  # fmt: skip


def _write_succeeded_day(
    out: io.StringIO, schedule_id: uuid.UUID, tenant_id: uuid.UUID, expression: str, zone: str
) -> int:
    """COPY text of the rule's SUCCEEDED occurrences on DAY; returns how many."""
    instants = expected_cron_instants(
        expression, zone, Schedule.DstGap.SKIP, Schedule.DstFold.FIRST, DAY,
        DAY + timedelta(days=1),
    )  # fmt: skip
    for at in instants:
        text = at.isoformat()
        out.write(
            copy_line(
                occurrence_id_for(schedule_id, 1, at), text, schedule_id, 1, tenant_id,
                Lane.STRICT, Occurrence.State.SUCCEEDED, text, text, 1, text, text,
            )
        )  # fmt: skip
    return len(instants)


def _write(tenant_id: uuid.UUID, count: int) -> int:
    valid_from = DAY - timedelta(days=1)
    # The materializer's frontier lies past the audited day and in the future: these
    # schedules are up to date (the audit's stalled-materializer class judges `now`).
    next_run_at = max(DAY + timedelta(days=2), datetime.now(UTC) + timedelta(days=1))
    occurrences = 0
    chunk = 20_000
    with connection.cursor() as cursor:
        for start in range(0, count, chunk):
            batch, occs = ScheduleBatch(), io.StringIO()
            for n in range(start, min(count, start + chunk)):
                sid = uuid.uuid4()
                expression, zone = _rule(n)
                batch.add_schedule(
                    sid, tenant_id, expression=expression, time_zone=zone,
                    precision=Schedule.Precision.STRICT, flexible_window_s=0,
                    next_run_at=next_run_at, created_at=valid_from,
                    definition=_definition(expression, zone),
                )  # fmt: skip
                occurrences += _write_succeeded_day(occs, sid, tenant_id, expression, zone)
            batch.copy(cursor)
            copy_into(cursor, OCCURRENCE_COPY, occs.getvalue())
    return occurrences


def _run_reconcile(slug: str) -> dict[str, Any]:
    """`manage.py reconcile --json` over DAY for the bench tenant, in a child process."""
    child = subprocess.run(  # noqa: S603 - our own manage.py with fixed arguments
        [
            sys.executable,
            str(ROOT / "manage.py"),
            "reconcile",
            "--tenant",
            slug,
            "--from",
            DAY.isoformat(),
            "--to",
            (DAY + timedelta(days=1)).isoformat(),
            "--json",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        check=False,
    )
    if not child.stdout.strip().startswith("{"):
        raise RuntimeError(f"reconcile failed: {child.stderr[-2000:]}")
    data: dict[str, Any] = json.loads(child.stdout)
    return data


def _remove(tenant_id: uuid.UUID, *, drop_partitions: bool) -> None:
    """Delete everything the bench wrote; drop DAY's partitions if the bench created them."""
    with connection.cursor() as cursor:
        for table in ("schedules_scheduleversion", "schedules_scheduleevent",
                      "schedules_schedule"):  # fmt: skip
            cursor.execute(f"DELETE FROM {table} WHERE tenant_id = %s", [tenant_id])  # noqa: S608
        if drop_partitions:
            for table in PARTITIONED_TABLES:
                cursor.execute(f'DROP TABLE IF EXISTS "{partition_name(table, DAY.date())}"')
        else:
            cursor.execute("DELETE FROM occurrences_occurrence WHERE tenant_id = %s", [tenant_id])
        cursor.execute("DELETE FROM tenants_tenant WHERE id = %s", [tenant_id])


def bench_reconcile(*, schedules: int) -> ReconcileBench:
    slug = f"bench-rec-{uuid.uuid4().hex[:8]}"
    created = partitions_ensure([DAY.date()])
    tenant = tenant_create(slug=slug, name="reconcile bench")
    try:
        started = time.perf_counter()
        occurrences = _write(tenant.id, schedules)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE schedules_schedule")
            cursor.execute(f'ANALYZE "{partition_name("occurrences_occurrence", DAY.date())}"')
        setup_s = time.perf_counter() - started
        data = _run_reconcile(slug)
        elapsed = float(data["elapsed_s"])
        return ReconcileBench(
            schedules=data["schedules"],
            occurrences=data["stored_occurrences"],
            setup_s=round(setup_s, 1),
            reconcile_s=elapsed,
            schedules_per_s=data["schedules_per_s"],
            occurrences_per_s=round(occurrences / elapsed, 1) if elapsed else 0.0,
            peak_rss_mib=data["peak_rss_mib"],
            ok=data["ok"],
            counts=data["counts"],
        )
    finally:
        _remove(tenant.id, drop_partitions=bool(created))


def report_json(report: ReconcileBench) -> str:
    return json.dumps(asdict(report), indent=2)
