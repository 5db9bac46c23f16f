from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.occurrences.bench.burst import bench_burst, report_json


class Command(BaseCommand):
    help = (
        "Burst benchmark: N schedules of T tenants due at one instant, real materialize and "
        "relay processes, an independent consumer. Last line: one JSON object."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--schedules", type=int, default=20_000)
        parser.add_argument("--tenants", type=int, default=10)
        parser.add_argument("--flexible-window", type=int, default=0, help="seconds (≤ 300)")
        parser.add_argument("--extra-active", type=int, default=0, help="non-due schedules")
        parser.add_argument("--lead", type=float, default=60.0, help="seconds until the burst")
        parser.add_argument("--timeout", type=float, default=120.0)
        parser.add_argument("--json", action="store_true", help="only the JSON line")

    def handle(self, *args: Any, **options: Any) -> None:
        quiet = options["json"]
        report = bench_burst(
            schedules=options["schedules"],
            tenants=options["tenants"],
            flexible_window_s=options["flexible_window"],
            extra_active=options["extra_active"],
            lead_s=options["lead"],
            timeout_s=options["timeout"],
            log=None if quiet else self.stdout.write,
        )
        if not quiet:
            for line in report.lines():
                self.stdout.write(line)
        self.stdout.write(report_json(report))
