from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.bench.burst import bench_burst, report_json

# The options passed on to bench_burst, each stored under the parameter's own name.
BURST_PARAMETERS = (
    "schedules",
    "tenants",
    "flexible_window_s",
    "extra_active",
    "lead_s",
    "timeout_s",
    "materializers",
    "relays",
    "keep",
)


class Command(BaseCommand):
    help = (
        "Burst benchmark: N schedules of T tenants due at one instant, real materialize and "
        "relay processes, an independent consumer. Last line: one JSON object."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--schedules", type=int, default=20_000)
        parser.add_argument("--tenants", type=int, default=10)
        parser.add_argument(
            "--flexible-window", dest="flexible_window_s", metavar="FLEXIBLE_WINDOW",
            type=int, default=0, help="seconds (≤ 300)",
        )  # fmt: skip
        parser.add_argument("--extra-active", type=int, default=0, help="non-due schedules")
        parser.add_argument(
            "--lead", dest="lead_s", metavar="LEAD", type=float, default=60.0,
            help="seconds until the burst",
        )  # fmt: skip
        parser.add_argument("--timeout", dest="timeout_s", metavar="TIMEOUT", type=float,
                            default=120.0)  # fmt: skip
        parser.add_argument("--materializers", type=int, default=1, help="processes")
        parser.add_argument("--relays", type=int, default=1, help="processes")
        parser.add_argument(
            "--keep", action="store_true",
            help="leave every row in place (use a scratch database)",
        )  # fmt: skip
        parser.add_argument("--json", action="store_true", help="only the JSON line")

    def handle(self, *args: Any, **options: Any) -> None:
        quiet = options["json"]
        report = bench_burst(
            **{name: options[name] for name in BURST_PARAMETERS},
            log=None if quiet else self.stdout.write,
        )
        if not quiet:
            for line in report.lines():
                self.stdout.write(line)
        self.stdout.write(report_json(report))
