"""The shared shape of Tick's long-running commands: a SIGTERM-aware loop that refreshes
shard leases (when the process has any) and calls one unit of work until told to stop.

Outages (outages.py) never end the loop: a database or broker error anywhere in an
iteration — the lease refresh included — marks the process unready, is logged once, and the
iteration is retried with capped backoff. Leases that expired meanwhile are simply taken
again (a new fencing generation), so a process that was cut off can never act on a lease it
lost. Only a signal or a persistent configuration error (bad settings) ends it.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType

from django.core.exceptions import ImproperlyConfigured

from apps.occurrences.observability import metrics
from apps.occurrences.observability.health import ProcessHealth, serve_process
from apps.occurrences.pipeline.leases import LeaseSet
from apps.occurrences.pipeline.outages import (
    Backoff,
    Dependency,
    OutageTracker,
    drop_database_connection,
    outage_of,
)

log = logging.getLogger(__name__)


class StopFlag:
    """Set by SIGTERM/SIGINT; `wait` sleeps but wakes at once when a stop is requested."""

    def __init__(self) -> None:
        self.event = threading.Event()
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)

    @property
    def stopping(self) -> bool:
        return self.event.is_set()

    def wait(self, seconds: float) -> None:
        self.event.wait(seconds)

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.event.set()


def process_owner(role: str) -> str:
    return f"{role}@{socket.gethostname()}:{os.getpid()}"


# Failures no retry can fix (settings): the process exits. A ProgrammingError is not among
# them: concurrent partition creation raises one ("already exists") that the next try passes.
PERSISTENT_ERRORS: tuple[type[BaseException], ...] = (ImproperlyConfigured,)


def run_loop(
    *,
    role: str,
    owner: str,
    unit: Callable[[], int],
    idle_sleep_s: float,
    once: bool = False,
    metrics_port: int | None = None,
    leases: LeaseSet | None = None,
    before_release: Callable[[], None] | None = None,
) -> None:
    """Run `unit` (returns how much it did) until SIGTERM, sleeping when idle.

    With `leases`, they are refreshed every ttl/3 inside the guarded iteration. With
    `metrics_port`, /metrics, /healthz and /readyz are served on that port; `before_release`
    runs at shutdown while the leases are still held (to finish fenced work).
    """
    health = ProcessHealth(role)
    if metrics_port:
        serve_process(metrics_port, health)
    stop = StopFlag()
    outage = OutageTracker(owner)
    backoff = Backoff()
    renew_every = max(leases.ttl_s / 3, 1.0) if leases is not None else 0.0
    next_renew = 0.0
    try:
        while not stop.stopping:
            try:
                if leases is not None and time.monotonic() >= next_renew:
                    held = leases.refresh()
                    next_renew = time.monotonic() + renew_every
                    log.debug("%s holds %d shards", owner, len(held))
                    metrics.measure_clock_skew(role)
                done = unit()
            except PERSISTENT_ERRORS:
                log.critical("%s: persistent error; exiting", owner, exc_info=True)
                raise
            except Exception as exc:
                dependency = outage_of(exc)
                if dependency is None:
                    # A bug or a poison row: log it in full, count the failure, go on.
                    log.exception("%s: unit of work failed; retrying", owner)
                    health.beat(ok=False)
                    drop_database_connection()
                    if once:
                        break
                    stop.wait(idle_sleep_s)
                    continue
                outage.failed(dependency, exc)
                health.beat(ok=False, detail=f"{dependency} unavailable")
                metrics.outage_retries.labels(role=role, dependency=dependency).inc()
                if dependency is Dependency.DATABASE:
                    drop_database_connection()
                    next_renew = 0.0  # re-check the leases first thing when it is back
                if once:
                    break
                stop.wait(backoff.next_delay())
                continue
            if outage.down:
                outage.recovered()
            backoff.reset()
            health.beat(ok=True)
            if once:
                break
            if done == 0:
                stop.wait(idle_sleep_s)
    finally:
        if before_release is not None:
            before_release()
        if leases is not None:
            try:
                leases.release()
            except Exception:  # noqa: BLE001 - best effort at shutdown; leases expire anyway
                log.warning("could not release leases of %s", owner)
