from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import close_old_connections
from django.utils import timezone

from apps.occurrences import metrics
from apps.occurrences.execution import attempts_reap
from apps.occurrences.health import ProcessHealth, serve_process
from apps.occurrences.loop import StopFlag
from apps.occurrences.stuck import stuck_scan

log = logging.getLogger("tick.reap")


class Command(BaseCommand):
    help = "Send occurrences whose attempt lease expired back to RETRY_WAIT (loop)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true")
        parser.add_argument("--interval", type=float, default=5.0)
        parser.add_argument("--grace", type=int, default=10, help="seconds past lease expiry")
        # --- observability (issue 8): the stuck-state scan and the process's HTTP port
        parser.add_argument("--metrics-port", type=int, default=None)
        parser.add_argument(
            "--scan-interval", type=float, default=30.0, help="stuck-state scan every N s (0: off)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        stop = StopFlag()
        health = ProcessHealth("reaper")
        if options["metrics_port"]:
            serve_process(options["metrics_port"], health)
        next_scan = 0.0
        while not stop.stopping:
            if options["scan_interval"] and time.monotonic() >= next_scan:
                next_scan = time.monotonic() + options["scan_interval"]
                try:
                    metrics.measure_clock_skew("reaper")
                    scan = stuck_scan(
                        now=timezone.now(),
                        shards=settings.TICK_SHARDS,
                        window_s=settings.TICK_PLANNING_WINDOW_S,
                        lease_grace_s=options["grace"],
                        top_tenants=settings.TICK_METRICS_TOP_TENANTS,
                        broker_url=settings.CELERY_BROKER_URL,
                        queue_prefix=settings.TICK_QUEUE_PREFIX,
                        partitions=settings.TICK_TENANT_PARTITIONS,
                    )
                    if scan.stuck_outbox or scan.stuck_running or scan.stuck_schedules:
                        log.warning("stuck-state scan: %s", scan)
                except Exception:
                    log.exception("stuck-state scan failed")
                    close_old_connections()
            try:
                result = attempts_reap(now=timezone.now(), grace_s=options["grace"])
            except Exception:
                log.exception("reap failed; retrying")
                health.beat(ok=False)
                close_old_connections()
                time.sleep(options["interval"])
                continue
            health.beat(ok=True)
            if result.expired:
                log.warning(
                    "reaped %d expired attempts: %d requeued, %d dead",
                    result.expired, result.requeued, result.dead,
                )  # fmt: skip
            if options["once"]:
                return
            if result.expired < 1000:
                time.sleep(options["interval"])
