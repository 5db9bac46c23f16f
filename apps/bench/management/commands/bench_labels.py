from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.bench.labels import PAGE, load, measure
from apps.tenants.models import Tenant


class Command(BaseCommand):
    help = (
        "The schedule list's filters (state, handler, labels) at N schedules of one tenant: "
        "loads them by SQL into the database given (use a scratch one), then times each "
        "filter's first and third page. Last line: JSON."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--schedules", type=int, default=1_000_000)
        parser.add_argument("--repeats", type=int, default=20)
        parser.add_argument("--tenant", help="Measure this tenant's slug again, no load.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["tenant"]:
            tenant = Tenant.objects.get(slug=options["tenant"])
        else:
            tenant = load(options["schedules"])
            self.stdout.write(f"loaded {options['schedules']:,} schedules into {tenant.slug}")
        results = measure(tenant, options["repeats"])
        self.stdout.write(f"{'filter':32} {'rows':>4} {'p.1 ms':>8} {'p.3 ms':>8}  plan")
        for r in results:
            self.stdout.write(
                f"{r['filter']:32} {r['rows']:>4} {r['first_ms']:>8} {r['third_ms']:>8}  "
                f"{r['plan']}"
            )
        self.stdout.write(json.dumps({"page": PAGE, "results": results}))
