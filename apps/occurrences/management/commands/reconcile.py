from __future__ import annotations

import argparse
import json
import os
import resource
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from apps.occurrences.audit.reconcile import FAILING, StuckBounds, reconcile
from apps.tenants.models import Tenant


def _seconds(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive number of seconds")
    return value


# (option, StuckBounds field, setting, what the bound measures)
_BOUNDS = (
    ("--enqueued-bound", "enqueued_s", "TICK_AUDIT_ENQUEUED_BOUND_S",
     "ENQUEUED this long after enqueued_at, no attempt open or ended meanwhile: stuck_enqueued"),
    ("--scheduled-bound", "scheduled_s", "TICK_AUDIT_SCHEDULED_BOUND_S",
     "SCHEDULED / RETRY_WAIT this long past due and unpublished: stuck_scheduled"),
    ("--running-bound", "running_s", "TICK_AUDIT_RUNNING_BOUND_S",
     "RUNNING this long past the open attempt's lease expiry: stuck_running"),
    ("--materialize-lag", "materialize_lag_s", "TICK_AUDIT_MATERIALIZE_LAG_S",
     "an ACTIVE schedule's next_run_at this far in the past: unmaterialized"),
)  # fmt: skip


def _instant(text: str) -> datetime:
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if value.tzinfo is None:
        raise CommandError(f"{text!r}: give an offset (e.g. 2026-01-01T00:00:00Z)")
    return value


class Command(BaseCommand):
    help = (
        "Audit stored occurrences in [--from, --to) against an independent recomputation, "
        "and look for work stuck past its bound (occurrences of the window ENQUEUED, "
        "SCHEDULED/RETRY_WAIT or RUNNING too long; ACTIVE schedules whose next_run_at lags). "
        "Exit status 1 when anything is missing, stranded, unexpected, stuck or "
        "unmaterialized."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--from", dest="start", type=_instant)
        parser.add_argument("--to", dest="end", type=_instant)
        parser.add_argument(
            "--recent", type=int, default=None, metavar="MINUTES",
            help="instead of --from/--to: the MINUTES that ended 10 minutes ago (for cron)",
        )  # fmt: skip
        parser.add_argument(
            "--textfile", default=None,
            help="also write tick_reconcile_* gauges here (node_exporter textfile collector)",
        )  # fmt: skip
        parser.add_argument("--tenant", default=None, help="tenant slug")
        parser.add_argument("--json", action="store_true")
        for option, dest, setting, what in _BOUNDS:
            parser.add_argument(
                option, dest=dest, type=_seconds, default=None, metavar="S",
                help=f"{what} (seconds; default {setting} = {getattr(settings, setting)})",
            )  # fmt: skip

    def handle(self, *args: Any, **options: Any) -> None:
        tenant_id = None
        if options["tenant"]:
            tenant = Tenant.objects.filter(slug=options["tenant"]).first()
            if tenant is None:
                raise CommandError(f"no tenant {options['tenant']!r}")
            tenant_id = tenant.id
        start, end = options["start"], options["end"]
        if options["recent"]:
            end = timezone.now().replace(microsecond=0) - timedelta(minutes=10)
            start = end - timedelta(minutes=options["recent"])
        if start is None or end is None or end <= start:
            raise CommandError("give --from and --to (from before to), or --recent MINUTES")
        given = {dest: options[dest] for _, dest, _, _ in _BOUNDS if options[dest] is not None}
        bounds = StuckBounds.from_settings(**given)
        report = reconcile(start=start, end=end, tenant_id=tenant_id, bounds=bounds)
        data = report.as_json()
        data["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        if options["json"]:
            self.stdout.write(json.dumps(data, indent=2))
        else:
            for kind, count in data["counts"].items():
                self.stdout.write(f"{kind:>18} {count}")
            for kind, samples in data["samples"].items():
                for sample in samples:
                    self.stdout.write(f"{kind}: {sample}")
            self.stdout.write(
                f"stuck as of {data['now']}: ENQUEUED > {bounds.enqueued_s} s, past due > "
                f"{bounds.scheduled_s} s, past lease > {bounds.running_s} s, next_run_at "
                f"behind > {bounds.materialize_lag_s} s"
            )
            self.stdout.write(
                f"{data['schedules']} schedules, {data['stored_occurrences']} occurrences in "
                f"{data['elapsed_s']} s ({data['schedules_per_s']} schedules/s), "
                f"peak RSS {data['peak_rss_mib']} MiB: {'OK' if data['ok'] else 'FAILED'}"
            )
        if options["textfile"]:
            _write_textfile(options["textfile"], data)
        if report.failed:
            raise SystemExit(1)


def _write_textfile(path: str, data: dict[str, Any]) -> None:
    """Prometheus text format, written atomically (the collector may read at any moment)."""
    lines = [
        "# HELP tick_reconcile_findings Findings of the last reconciliation, by class",
        "# TYPE tick_reconcile_findings gauge",
    ]
    counts = dict(data["counts"])
    for kind in FAILING:
        counts.setdefault(kind, 0)
    lines += [f'tick_reconcile_findings{{kind="{k}"}} {v}' for k, v in sorted(counts.items())]
    lines += [
        "# TYPE tick_reconcile_last_run_timestamp_seconds gauge",
        f"tick_reconcile_last_run_timestamp_seconds {timezone.now().timestamp():.0f}",
        "# TYPE tick_reconcile_duration_seconds gauge",
        f"tick_reconcile_duration_seconds {data['elapsed_s']}",
    ]
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    os.replace(tmp, path)
