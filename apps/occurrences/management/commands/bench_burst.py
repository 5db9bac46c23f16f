from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.occurrences.benchmarks import bench_burst
from tickweb.celery import app as celery_app


class Command(BaseCommand):
    help = "Burst benchmark: N strict occurrences due at one instant; lag to the durable queue."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--schedules", type=int, default=20_000)
        parser.add_argument("--tenants", type=int, default=10)
        parser.add_argument("--lead", type=float, default=20.0, help="seconds before the burst")

    def handle(self, *args: Any, **options: Any) -> None:
        result = bench_burst(
            schedules=options["schedules"],
            tenants=options["tenants"],
            lead_s=options["lead"],
            celery_app=celery_app,
        )
        for line in result.lines():
            self.stdout.write(line)
