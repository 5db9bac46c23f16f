from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.bench.reconcile import bench_reconcile, report_json


class Command(BaseCommand):
    help = "Benchmark `manage.py reconcile` over one day of N schedules (private tenant)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--schedules", type=int, default=100_000)

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(report_json(bench_reconcile(schedules=options["schedules"])))
