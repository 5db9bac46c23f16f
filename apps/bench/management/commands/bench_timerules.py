from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.bench.timerules import bench_timerules, format_results


class Command(BaseCommand):
    help = "Benchmark cron evaluation: µs per call and 500k schedules sharing 50 rules."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--schedules", type=int, default=500_000)
        parser.add_argument("--rules", type=int, default=50)
        parser.add_argument("--afters", type=int, default=60)

    def handle(self, *args: Any, **options: Any) -> None:
        results = bench_timerules(
            options["schedules"], options["rules"], distinct_afters=options["afters"]
        )
        for line in format_results(results):
            self.stdout.write(line)
