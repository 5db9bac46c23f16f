from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.bench.api_load import ENDPOINTS, bench_api, report_json

# The options passed on to bench_api, each stored under the parameter's own name.
API_PARAMETERS = (
    "schedules",
    "clients",
    "seconds",
    "endpoints",
    "base_url",
    "during_burst",
    "burst_clients",
    "burst_lead_s",
    "burst_before_s",
    "burst_timeout_s",
)


def _int_list(text: str) -> list[int]:
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or min(values) < 1:
        raise ValueError(text)
    return values


def _endpoints(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = set(names) - set(ENDPOINTS)
    if not names or unknown:
        raise CommandError(f"--endpoints: choose from {', '.join(ENDPOINTS)}")
    return names


class Command(BaseCommand):
    help = (
        "API load benchmark: gunicorn as the Procfile runs it, a bench tenant, N clients per "
        "endpoint (create, read, list, preview); optionally schedule changes during a burst. "
        "Last line: one JSON object."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--schedules", type=int, default=1000, help="preloaded")
        parser.add_argument("--clients", type=_int_list, default=[1, 8, 32],
                            help="concurrent clients per run, comma-separated")  # fmt: skip
        parser.add_argument("--seconds", type=float, default=10.0, help="per run")
        parser.add_argument("--endpoints", type=_endpoints, default=list(ENDPOINTS),
                            help=f"comma-separated, of {','.join(ENDPOINTS)}")  # fmt: skip
        parser.add_argument(
            "--base-url", default=None,
            help="use this server (same database) instead of starting one",
        )  # fmt: skip
        parser.add_argument("--during-burst", type=int, default=0, metavar="N",
                            help="also measure schedule changes during a burst of N")  # fmt: skip
        parser.add_argument("--burst-clients", type=int, default=4)
        parser.add_argument("--burst-lead", dest="burst_lead_s", metavar="LEAD", type=float,
                            default=60.0, help="seconds until the burst")  # fmt: skip
        parser.add_argument("--burst-before", dest="burst_before_s", metavar="BEFORE",
                            type=float, default=10.0,
                            help="changes start this many seconds before the instant")  # fmt: skip
        parser.add_argument("--burst-timeout", dest="burst_timeout_s", metavar="TIMEOUT",
                            type=float, default=120.0)  # fmt: skip
        parser.add_argument("--json", action="store_true", help="only the JSON line")

    def handle(self, *args: Any, **options: Any) -> None:
        quiet = options["json"]
        report = bench_api(
            **{name: options[name] for name in API_PARAMETERS},
            log=None if quiet else self.stdout.write,
        )
        if not quiet:
            for line in report.lines():
                self.stdout.write(line)
        self.stdout.write(report_json(report))
