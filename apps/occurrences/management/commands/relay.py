from __future__ import annotations

import logging
from typing import Any

from django.conf import settings

from apps.occurrences.management.commands._loop_command import LoopCommand, LoopWork
from apps.occurrences.models import ShardLease
from apps.occurrences.pipeline.broker import Publisher
from apps.occurrences.pipeline.loop import process_leases
from apps.occurrences.pipeline.relay import Recorder, RelayConfig, RelayResult, relay_step
from apps.occurrences.pipeline.staging import StageConfig, Stager
from apps.occurrences.pipeline.throttle import TenantThrottle
from tickweb.celery import app as celery_app


class Command(LoopCommand):
    help = "Publish due outbox rows of the shards this process leases to RabbitMQ."
    role = ShardLease.Role.RELAY
    logger = logging.getLogger("tick.relay")
    once_help = "one step, then exit"
    idle_sleep_default_s = 0.1

    def work(self, options: dict[str, Any]) -> LoopWork:
        leases = process_leases(self.role)
        config = RelayConfig.from_settings()
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
        stager = Stager(
            leases=leases,
            publisher=publisher,
            relay_config=config,
            config=StageConfig.from_settings(),
        )

        def unit() -> int:
            done = 0
            if stager.publish_due():
                done += self._logged(stager.publish(recorder=recorder, throttle=throttle), "staged")
            result = relay_step(
                leases=leases,
                publisher=publisher,
                config=config,
                recorder=recorder,
                throttle=throttle,
                before=stager.instant,
                skip=stager.settling(recorder),
            )
            stager.stepped()
            done += self._logged(result, "due")
            # Deferred rows are not work done now: sleep rather than re-read them at once.
            # Staging is: go on at once while there is more to read.
            return done + stager.advance()

        # Record what was confirmed while the shards are still ours.
        def close() -> None:
            publisher.close()
            throttle.close()

        return LoopWork(unit, leases=leases, before_release=recorder.stop, close=close)

    def _logged(self, result: RelayResult, what: str) -> int:
        """Log a publish that did something; returns the rows it settled, plus the late rows left
        for the next step (work to go on with at once, not to sleep on)."""
        if result.claimed:
            self.logger.info(
                "relayed %d of %d %s rows in %d messages (failed %d, missed %d, left to judge %d),"
                " max lag %.3fs",
                result.published, result.claimed, what, result.messages, result.failed,
                result.missed, result.unjudged, max(result.lags, default=0.0),
            )  # fmt: skip
        return result.published + result.failed + result.missed + result.unjudged
