from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.bench.bulk_pause import bench_bulk, report_json


class Command(BaseCommand):
    help = (
        "Bulk pause benchmark: a real `manage.py bulk` pauses N schedules, alone and while a "
        "burst of M strict schedules of other tenants is due (real materialize, relay and "
        "consumer). Last line: one JSON object."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--schedules", type=int, default=100_000, help="paused during")
        parser.add_argument("--burst", dest="burst_schedules", type=int, default=100_000)
        parser.add_argument(
            "--alone", dest="alone_schedules", type=int, default=10_000,
            help="paused first with nothing else running (0: skip)",
        )  # fmt: skip
        parser.add_argument("--burst-tenants", type=int, default=10)
        parser.add_argument("--lead", dest="lead_s", type=float, default=60.0,
                            help="seconds until the burst")  # fmt: skip
        parser.add_argument("--timeout", dest="timeout_s", type=float, default=900.0)
        parser.add_argument(
            "--until-delivered", action="store_true",
            help="measure the bulk until the burst is delivered, then stop it (rate only)",
        )  # fmt: skip
        parser.add_argument(
            "--bulk-before", dest="bulk_before_s", type=float, default=None,
            help="start the bulk this many seconds before the instant (default: with the "
            "pipeline, --lead before it)",
        )  # fmt: skip
        parser.add_argument("--json", action="store_true", help="only the JSON line")

    def handle(self, *args: Any, **options: Any) -> None:
        quiet = options["json"]
        report = bench_bulk(
            schedules=options["schedules"], burst_schedules=options["burst_schedules"],
            alone_schedules=options["alone_schedules"], burst_tenants=options["burst_tenants"],
            lead_s=options["lead_s"], timeout_s=options["timeout_s"],
            finish=not options["until_delivered"], bulk_before_s=options["bulk_before_s"],
            log=None if quiet else self.stdout.write,
        )  # fmt: skip
        if not quiet:
            for line in report.lines():
                self.stdout.write(line)
        self.stdout.write(report_json(report))
