from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from apps.occurrences.models import ShardLease
from apps.occurrences.pipeline.leases import LeaseSet
from apps.occurrences.pipeline.loop import process_owner, run_loop
from apps.occurrences.pipeline.materializer import MaterializeConfig, materialize_pass

log = logging.getLogger("tick.materialize")


class Command(BaseCommand):
    help = "Materialize due schedules of the shards this process leases, until SIGTERM."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--metrics-port", type=int, default=None)
        parser.add_argument("--once", action="store_true", help="one pass, then exit")
        parser.add_argument("--idle-sleep", type=float, default=1.0)

    def handle(self, *args: Any, **options: Any) -> None:
        leases = LeaseSet(
            role=ShardLease.Role.MATERIALIZER,
            owner=process_owner("materializer"),
            shards_total=settings.TICK_SHARDS,
            ttl_s=settings.TICK_LEASE_TTL_S,
        )
        config = MaterializeConfig(
            window_s=settings.TICK_PLANNING_WINDOW_S,
            batch_size=settings.TICK_MATERIALIZE_BATCH,
            max_fires_per_pass=settings.TICK_MAX_FIRES_PER_PASS,
            missed_record_limit=settings.TICK_MISSED_RECORD_LIMIT,
        )

        def unit() -> int:
            result = materialize_pass(leases=leases, now=timezone.now(), config=config)
            if result.schedules:
                log.info(
                    "materialized %d schedules: %d occurrences (%d outboxed, %d conflicts, "
                    "%d missed, %d completed)", result.schedules, result.inserted,
                    result.outboxed, result.conflicts, result.missed, result.completed,
                )  # fmt: skip
            return result.schedules

        log.info("materializer %s starting", leases.owner)
        run_loop(
            role=leases.role,
            owner=leases.owner,
            leases=leases,
            unit=unit,
            idle_sleep_s=options["idle_sleep"],
            once=options["once"],
            metrics_port=options["metrics_port"],
        )
