from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from apps.occurrences.pipeline.partitions import partitions_maintain


class Command(BaseCommand):
    help = "Create daily occurrence/attempt partitions ahead and drop those past retention."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--days-ahead", type=int, default=settings.TICK_PARTITION_DAYS_AHEAD)
        parser.add_argument("--retention-days", type=int, default=settings.TICK_RETENTION_DAYS)

    def handle(self, *args: Any, **options: Any) -> None:
        report = partitions_maintain(
            today=timezone.now().date(),
            days_ahead=options["days_ahead"],
            retention_days=options["retention_days"],
        )
        self.stdout.write(
            f"partitions: created {len(report.created)}, dropped {len(report.dropped)}"
        )
        for name in report.created:
            self.stdout.write(f"  + {name}")
        for name in report.dropped:
            self.stdout.write(f"  - {name}")
