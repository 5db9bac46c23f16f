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

from django.conf import settings
from django.db import connection

from apps.occurrences.audit.reconcile import expected_cron_instants
from apps.occurrences.models import occurrence_id_for
from apps.occurrences.pipeline.partitions import (
    PARTITIONED_TABLES,
    partition_name,
    partitions_ensure,
)
from apps.schedules.models import shard_for
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


def _write(tenant_id: uuid.UUID, count: int) -> int:
    valid_from = DAY - timedelta(days=1)
    # The materializer's frontier lies past the audited day and in the future: these
    # schedules are up to date (the audit's stalled-materializer class judges `now`).
    next_run_at = max(DAY + timedelta(days=2), datetime.now(UTC) + timedelta(days=1))
    lo, hi = DAY, DAY + timedelta(days=1)
    occurrences = 0
    chunk = 20_000
    with connection.cursor() as cursor:
        raw = cursor.cursor  # psycopg's cursor: COPY is its own protocol
        for start in range(0, count, chunk):
            schedules, versions, occs = io.StringIO(), io.StringIO(), io.StringIO()
            for n in range(start, min(count, start + chunk)):
                sid = uuid.uuid4()
                expression, zone = _rule(n)
                definition = json.dumps({"kind": "CRON", "expression": expression,
                                         "time_zone": zone, "dst_gap": "skip",
                                         "dst_fold": "first"})  # fmt: skip
                shard = shard_for(sid, settings.TICK_SHARDS)
                schedules.write(
                    f"{sid}\t{tenant_id}\tbench\tCRON\t{expression}\t{zone}\tskip\tfirst\t"
                    f"STRICT\t0\tFIRE_ONCE\t60\t0\tALLOW\trecord\t{{}}\t1\tACTIVE\t"
                    f"{next_run_at.isoformat()}\t{shard}\t"
                    f"{valid_from.isoformat()}\t{valid_from.isoformat()}\n"
                )
                versions.write(f"{sid}\t{tenant_id}\t1\t{definition}\t{valid_from.isoformat()}\n")
                for at in expected_cron_instants(expression, zone, "skip", "first", lo, hi):
                    text = at.isoformat()
                    occs.write(
                        f"{occurrence_id_for(sid, 1, at)}\t{text}\t{sid}\t1\t{tenant_id}\t"
                        f"strict\tSUCCEEDED\t{text}\t{text}\t1\t{text}\t{text}\n"
                    )
                    occurrences += 1
            with raw.copy(
                "COPY schedules_schedule (id, tenant_id, name, kind, expression, time_zone, "
                "dst_gap, dst_fold, precision, flexible_window_s, misfire_policy, "
                "max_lateness_s, catchup_limit, overlap_policy, handler, payload, version, "
                "state, next_run_at, shard, created_at, updated_at) FROM STDIN"
            ) as copy:
                copy.write(schedules.getvalue())
            with raw.copy(
                "COPY schedules_scheduleversion (schedule_id, tenant_id, version, definition, "
                "valid_from) FROM STDIN"
            ) as copy:
                copy.write(versions.getvalue())
            with raw.copy(
                "COPY occurrences_occurrence (id, scheduled_for, schedule_id, schedule_version, "
                "tenant_id, lane, state, available_at, enqueued_at, attempt_count, created_at, "
                "finished_at) FROM STDIN"
            ) as copy:
                copy.write(occs.getvalue())
    return occurrences


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
        with connection.cursor() as cursor:
            for table in ("schedules_scheduleversion", "schedules_scheduleevent",
                          "schedules_schedule"):  # fmt: skip
                cursor.execute(f"DELETE FROM {table} WHERE tenant_id = %s", [tenant.id])  # noqa: S608
            if created:
                for table in PARTITIONED_TABLES:
                    cursor.execute(f'DROP TABLE IF EXISTS "{partition_name(table, DAY.date())}"')
            else:
                cursor.execute(
                    "DELETE FROM occurrences_occurrence WHERE tenant_id = %s", [tenant.id]
                )
            cursor.execute("DELETE FROM tenants_tenant WHERE id = %s", [tenant.id])


def report_json(report: ReconcileBench) -> str:
    return json.dumps(asdict(report), indent=2)
