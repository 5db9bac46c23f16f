from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from apps.occurrences.models import ShardLease
from apps.occurrences.pipeline.broker import Publisher
from apps.occurrences.pipeline.leases import LeaseSet
from apps.occurrences.pipeline.loop import process_owner, run_loop
from apps.occurrences.pipeline.relay import Recorder, RelayConfig, relay_step
from apps.occurrences.pipeline.throttle import TenantThrottle
from tickweb.celery import app as celery_app

log = logging.getLogger("tick.relay")


class Command(BaseCommand):
    help = "Publish due outbox rows of the shards this process leases to RabbitMQ."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--metrics-port", type=int, default=None)
        parser.add_argument("--once", action="store_true", help="one step, then exit")
        parser.add_argument("--idle-sleep", type=float, default=0.1)

    def handle(self, *args: Any, **options: Any) -> None:
        leases = LeaseSet(
            role=ShardLease.Role.RELAY,
            owner=process_owner("relay"),
            shards_total=settings.TICK_SHARDS,
            ttl_s=settings.TICK_LEASE_TTL_S,
        )
        config = RelayConfig(
            lookahead_ms=settings.TICK_RELAY_LOOKAHEAD_MS,
            batch_size=settings.TICK_RELAY_BATCH,
            prefix=settings.TICK_QUEUE_PREFIX,
            partitions=settings.TICK_TENANT_PARTITIONS,
            envelope_max=settings.TICK_RELAY_ENVELOPE_MAX,
        )
        publisher = Publisher(
            settings.CELERY_BROKER_URL,
            prefix=settings.TICK_QUEUE_PREFIX,
            partitions=settings.TICK_TENANT_PARTITIONS,
            celery_app=celery_app,
        )
        # The publisher connects on first use (and again after any broker error), so a broker
        # that is down at start is an outage the loop rides out, not a reason to exit.
        recorder = Recorder(leases)
        recorder.start()
        throttle = TenantThrottle()

        def unit() -> int:
            result = relay_step(
                leases=leases,
                publisher=publisher,
                config=config,
                recorder=recorder,
                throttle=throttle,
            )
            if result.claimed:
                worst = max(result.lags, default=0.0)
                log.info(
                    "relayed %d of %d in %d messages (failed %d), max lag %.3fs",
                    result.published, result.claimed, result.messages, result.failed, worst,
                )  # fmt: skip
            # Deferred rows are not work done now: sleep rather than re-read them at once.
            return result.published + result.failed

        log.info("relay %s starting", leases.owner)
        try:
            run_loop(
                role=leases.role,
                owner=leases.owner,
                leases=leases,
                unit=unit,
                idle_sleep_s=options["idle_sleep"],
                once=options["once"],
                metrics_port=options["metrics_port"],
                # Record what was confirmed while the shards are still ours.
                before_release=recorder.stop,
            )
        finally:
            publisher.close()
