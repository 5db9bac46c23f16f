from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.bench.execution import Pool
from apps.bench.outage import OutagePlan, bench_outage, report_lines


class Command(BaseCommand):
    help = (
        "Outage benchmark: four tenants of every-minute schedules (SKIP, FIRE_ONCE, CATCHUP "
        "K=5, a FIRE_ONCE bystander); the materializer, relay and reaper SIGKILLed for the "
        "outage while the workers stay up. Figures per policy, recovery time, the bystander's "
        "lags, reconcile. Last line: one JSON object."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--schedules", type=int, default=200, help="per tenant")
        parser.add_argument("--outage", dest="outage_s", type=float, default=600.0)
        parser.add_argument("--catchup-rate", type=int, default=20, help="catch-up runs/s")
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument("--concurrency", type=int, default=2)
        parser.add_argument(
            "--after", dest="after_s", type=float, default=150.0,
            help="seconds after the restart over which the bystander is measured",
        )  # fmt: skip
        parser.add_argument("--json", action="store_true", help="only the JSON line")

    def handle(self, *args: Any, **options: Any) -> None:
        quiet = options["json"]

        def say(text: str) -> None:
            if not quiet:
                self.stdout.write(text)

        plan = OutagePlan(
            schedules=options["schedules"], outage_s=options["outage_s"],
            catchup_rate=options["catchup_rate"],
            pool=Pool(workers=options["workers"], concurrency=options["concurrency"]),
            after_s=options["after_s"],
        )  # fmt: skip
        report = bench_outage(plan, say)
        for line in report_lines(report):
            say(line)
        self.stdout.write(json.dumps(asdict(report), default=str))
