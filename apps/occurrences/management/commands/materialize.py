from __future__ import annotations

import logging
from typing import Any

from django.utils import timezone

from apps.occurrences.management.commands._loop_command import LoopCommand, LoopWork
from apps.occurrences.models import ShardLease
from apps.occurrences.pipeline.loop import process_leases
from apps.occurrences.pipeline.materializer import MaterializeConfig, materialize_pass


class Command(LoopCommand):
    help = "Materialize due schedules of the shards this process leases, until SIGTERM."
    role = ShardLease.Role.MATERIALIZER
    logger = logging.getLogger("tick.materialize")
    once_help = "one pass, then exit"

    def work(self, options: dict[str, Any]) -> LoopWork:
        leases = process_leases(self.role)
        config = MaterializeConfig.from_settings()

        def unit() -> int:
            # A pass gives the loop back its turn every lease refresh interval, so the shards
            # are rebalanced while a long burst is being materialized.
            result = materialize_pass(
                leases=leases, now=timezone.now(), config=config, budget_s=leases.ttl_s / 3
            )
            if result.schedules:
                self.logger.info(
                    "materialized %d schedules: %d occurrences (%d outboxed, %d conflicts, "
                    "%d missed, %d completed)", result.schedules, result.inserted,
                    result.outboxed, result.conflicts, result.missed, result.completed,
                )  # fmt: skip
            return result.schedules

        return LoopWork(unit, leases=leases)
