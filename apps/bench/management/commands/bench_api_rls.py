from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.bench.api_rls import bench_api_rls, format_results


class Command(BaseCommand):
    help = (
        "API latency (list, read, create) with row-level security on and off, same run; "
        "uses two throwaway tenants it deletes afterwards. Last line: JSON."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--requests", type=int, default=300)
        parser.add_argument("--schedules", type=int, default=500)

    def handle(self, *args: Any, **options: Any) -> None:
        results = bench_api_rls(requests=options["requests"], schedules=options["schedules"])
        for line in format_results(results):
            self.stdout.write(line)
        self.stdout.write(json.dumps(results))
