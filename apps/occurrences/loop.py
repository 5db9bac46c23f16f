"""The shared shape of Tick's long-running commands: a SIGTERM-aware loop that refreshes
shard leases and calls one unit of work (materializer.py / relay.py) until told to stop."""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from types import FrameType

from django.db import close_old_connections

from apps.occurrences import metrics
from apps.occurrences.health import ProcessHealth, serve_process
from apps.occurrences.leases import LeaseSet

log = logging.getLogger(__name__)


class StopFlag:
    def __init__(self) -> None:
        self.stopping = False
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True


def process_owner(role: str) -> str:
    return f"{role}@{socket.gethostname()}:{os.getpid()}"


def run_leased_loop(
    *,
    leases: LeaseSet,
    unit: Callable[[], int],
    idle_sleep_s: float,
    once: bool = False,
    metrics_port: int | None = None,
    before_release: Callable[[], None] | None = None,
) -> None:
    """Refresh leases every ttl/3, run `unit` (returns how much it did), sleep when idle.

    With `metrics_port`, the process's Prometheus metrics are served on that port;
    `before_release` runs at shutdown while the leases are still held (to finish fenced work).
    """
    health = ProcessHealth(leases.role)
    if metrics_port:
        serve_process(metrics_port, health)
    stop = StopFlag()
    renew_every = max(leases.ttl_s / 3, 1.0)
    next_renew = 0.0
    try:
        while not stop.stopping:
            if time.monotonic() >= next_renew:
                held = leases.refresh()
                next_renew = time.monotonic() + renew_every
                log.debug("%s holds %d shards", leases.owner, len(held))
                metrics.measure_clock_skew(leases.role)
            try:
                done = unit()
                health.beat(ok=True)
            except Exception:
                log.exception("%s: unit of work failed; retrying", leases.owner)
                health.beat(ok=False)
                close_old_connections()
                done = 0
                time.sleep(idle_sleep_s)
            if once:
                break
            if done == 0:
                time.sleep(idle_sleep_s)
    finally:
        if before_release is not None:
            before_release()
        try:
            leases.release()
        except Exception:  # noqa: BLE001 - best effort at shutdown; leases expire anyway
            log.warning("could not release leases of %s", leases.owner)
