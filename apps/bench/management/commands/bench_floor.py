from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.bench.floor import bench_floor, floor_json


class Command(BaseCommand):
    help = (
        "The lean-SQL floor of Tick's lifecycle on this schema: PostgreSQL CPU and WAL per "
        "occurrence for materialize, relay, claim and complete (one at a time, and batched). "
        "Last line: one JSON object."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--occurrences", type=int, default=20_000, help="delivered")
        parser.add_argument("--executed", type=int, default=2_000, help="claimed, completed")
        parser.add_argument(
            "--execution-batch", type=int, default=10,
            help="claim and complete as many more rows this many per transaction (0: not)",
        )  # fmt: skip

    def handle(self, *args: Any, **options: Any) -> None:
        report = bench_floor(
            occurrences=options["occurrences"], executed=options["executed"],
            execution_batch=options["execution_batch"], log=self.stdout.write,
        )  # fmt: skip
        for line in report.lines():
            self.stdout.write(line)
        self.stdout.write(json.dumps(floor_json(report), sort_keys=True))
