from __future__ import annotations

import logging
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from apps.occurrences.execution import attempts_reap
from apps.occurrences.loop import StopFlag

log = logging.getLogger("tick.reap")


class Command(BaseCommand):
    help = "Send occurrences whose attempt lease expired back to RETRY_WAIT (loop)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true")
        parser.add_argument("--interval", type=float, default=5.0)
        parser.add_argument("--grace", type=int, default=10, help="seconds past lease expiry")

    def handle(self, *args: Any, **options: Any) -> None:
        stop = StopFlag()
        while not stop.stopping:
            result = attempts_reap(now=timezone.now(), grace_s=options["grace"])
            if result.expired:
                log.warning(
                    "reaped %d expired attempts: %d requeued, %d dead",
                    result.expired, result.requeued, result.dead,
                )  # fmt: skip
            if options["once"]:
                return
            if result.expired < 1000:
                time.sleep(options["interval"])
