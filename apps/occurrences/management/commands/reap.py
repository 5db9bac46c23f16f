from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.management.base import CommandParser
from django.utils import timezone

from apps.occurrences.alerts.dispatch import alerts_dispatch
from apps.occurrences.alerts.lag import lag_alerts_record
from apps.occurrences.audit.stuck import stuck_scan
from apps.occurrences.execution.reaper import attempts_reap
from apps.occurrences.failure_pause import failing_schedules_pause
from apps.occurrences.management.commands._loop_command import LoopCommand, LoopWork
from apps.occurrences.observability import metrics
from apps.occurrences.pipeline.broker import Publisher
from apps.occurrences.pipeline.outages import outage_of
from apps.occurrences.pipeline.redelivery import occurrences_redeliver
from tickweb.celery import app as celery_app

log = logging.getLogger("tick.reap")

REAP_LIMIT = 1000


class Command(LoopCommand):
    help = (
        "Send occurrences whose attempt lease expired back to RETRY_WAIT, and republish "
        "ENQUEUED ones the broker lost (loop)."
    )
    role = "reaper"
    logger = log
    once_help = "one pass, then exit"
    idle_sleep_flag = "--interval"
    idle_sleep_default_s = 5.0

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--grace", type=int, default=10, help="seconds past lease expiry")
        parser.add_argument(
            "--redeliver-after",
            type=int,
            default=None,
            help="republish ENQUEUED occurrences with no attempt after N s "
            "(default TICK_REDELIVER_AFTER_S)",
        )
        parser.add_argument(
            "--scan-interval", type=float, default=30.0, help="stuck-state scan every N s (0: off)"
        )

    def work(self, options: dict[str, Any]) -> LoopWork:
        return LoopWork(_ReaperPass(self.role, options).unit)


class _ReaperPass:
    """One reaper pass (`unit`): the stuck-state scan when due, expired leases, the
    backstop's redelivery (deep when due), then lag alerts and the alert dispatch. Keeps the
    schedule of the periodic parts and the alert publisher between passes."""

    def __init__(self, role: str, options: dict[str, Any]) -> None:
        self.role = role
        self.grace_s: int = options["grace"]
        self.scan_interval_s: float = options["scan_interval"]
        self.redeliver_after_s: int = options["redeliver_after"] or settings.TICK_REDELIVER_AFTER_S
        self.next_scan = self.next_deep = self.next_lag_check = 0.0
        self.publisher: Publisher | None = None

    def unit(self) -> int:
        if self.scan_interval_s and time.monotonic() >= self.next_scan:
            self.next_scan = time.monotonic() + self.scan_interval_s
            try:
                self.scan_stuck_states()
            except Exception as exc:
                if outage_of(exc) is not None:
                    raise  # the loop's outage handling: unready, backoff, log once
                # The scan only feeds gauges: its failure must not stop the reaping.
                log.exception("stuck-state scan failed")
        now = timezone.now()
        reaped = attempts_reap(now=now, grace_s=self.grace_s, limit=REAP_LIMIT)
        if reaped.expired:
            log.warning(
                "reaped %d expired attempts: %d requeued, %d dead",
                reaped.expired, reaped.requeued, reaped.dead,
            )  # fmt: skip
        republished = self.redeliver(now)
        # Before the alerts, so a pause's alert goes out in this pass.
        failing_schedules_pause()
        self.send_alerts()
        # A full batch means more may be waiting: go again without sleeping.
        full = reaped.expired >= REAP_LIMIT or republished >= REAP_LIMIT
        return 1 if full else 0

    def scan_stuck_states(self) -> None:
        metrics.measure_clock_skew(self.role)
        scan = stuck_scan(
            now=timezone.now(),
            shards=settings.TICK_SHARDS,
            window_s=settings.TICK_PLANNING_WINDOW_S,
            lease_grace_s=self.grace_s,
            top_tenants=settings.TICK_METRICS_TOP_TENANTS,
            broker_url=settings.CELERY_BROKER_URL,
            queue_prefix=settings.TICK_QUEUE_PREFIX,
            partitions=settings.TICK_TENANT_PARTITIONS,
        )
        if scan.stuck_outbox or scan.stuck_running or scan.stuck_schedules:
            log.warning("stuck-state scan: %s", scan)

    def redeliver(self, now: datetime) -> int:
        deep = time.monotonic() >= self.next_deep
        if deep:
            self.next_deep = time.monotonic() + settings.TICK_REDELIVER_DEEP_EVERY_S
        redelivered = occurrences_redeliver(
            now=now, after_s=self.redeliver_after_s, limit=REAP_LIMIT, deep=deep
        )
        if redelivered.republished:
            log.warning(
                "backstop: republishing %d occurrences ENQUEUED over %d s with no attempt",
                redelivered.republished, self.redeliver_after_s,
            )  # fmt: skip
        return redelivered.republished

    def send_alerts(self) -> None:
        try:
            if time.monotonic() >= self.next_lag_check:
                self.next_lag_check = time.monotonic() + settings.TICK_ALERT_LAG_EVERY_S
                lag_alerts_record(now=timezone.now())
            if self.publisher is None:
                self.publisher = Publisher(
                    settings.CELERY_BROKER_URL, prefix=settings.TICK_QUEUE_PREFIX,
                    partitions=settings.TICK_TENANT_PARTITIONS, celery_app=celery_app,
                )  # fmt: skip
            sent = alerts_dispatch(
                now=timezone.now(), publisher=self.publisher,
                coalesce_s=settings.TICK_ALERT_COALESCE_S,
                interval_s=settings.TICK_ALERT_CHANNEL_INTERVAL_S,
            )  # fmt: skip
            if sent.deliveries:
                log.info("alerts: %d messages for %d alerts", sent.deliveries, sent.alerts)
        except Exception as exc:
            if outage_of(exc) is not None:
                raise
            # Alerts are retried next pass; their failure must not stop the reaping.
            log.exception("alert dispatch failed")
