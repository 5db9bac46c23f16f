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

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from apps.occurrences.observability import metrics
from apps.occurrences.observability.health import ProcessHealth, serve_process
from apps.occurrences.pipeline.leases import LeaseHeartbeat, LeaseSet
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


def process_leases(role: str) -> LeaseSet:
    """This process's shard leases for `role`, sized by settings (refreshed by the loop)."""
    return LeaseSet(
        role=role,
        owner=process_owner(role),
        shards_total=settings.TICK_SHARDS,
        ttl_s=settings.TICK_LEASE_TTL_S,
    )


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
    heartbeat = LeaseHeartbeat(leases) if leases is not None and not once else None
    if heartbeat is not None:
        heartbeat.start()
    iteration = _GuardedIteration(
        role=role, owner=owner, unit=unit, idle_sleep_s=idle_sleep_s, health=health, leases=leases
    )
    try:
        while not stop.stopping:
            pause = iteration.run()
            if once:
                break
            if pause:
                stop.wait(pause)
    finally:
        if before_release is not None:
            before_release()
        if heartbeat is not None:
            heartbeat.stop()
        if leases is not None:
            try:
                leases.release()
            except Exception:  # noqa: BLE001 - best effort at shutdown; leases expire anyway
                log.warning("could not release leases of %s", owner)


class _GuardedIteration:
    """One iteration of `run_loop`: refresh the leases when due, run the unit of work, and
    turn the outcome into health, outage logs and the pause before the next iteration."""

    def __init__(
        self,
        *,
        role: str,
        owner: str,
        unit: Callable[[], int],
        idle_sleep_s: float,
        health: ProcessHealth,
        leases: LeaseSet | None,
    ) -> None:
        self.role = role
        self.owner = owner
        self.unit = unit
        self.idle_sleep_s = idle_sleep_s
        self.health = health
        self.leases = leases
        self.outage = OutageTracker(owner)
        self.backoff = Backoff()
        self.renew_every = max(leases.ttl_s / 3, 1.0) if leases is not None else 0.0
        self.next_renew = 0.0

    def run(self) -> float:
        """Returns the seconds to wait before the next iteration (0: go on at once)."""
        try:
            self._refresh_leases_when_due()
            done = self.unit()
        except PERSISTENT_ERRORS:
            log.critical("%s: persistent error; exiting", self.owner, exc_info=True)
            raise
        except Exception as exc:  # noqa: BLE001 - logged by _failed; the loop goes on
            return self._failed(exc)
        if self.outage.down:
            self.outage.recovered()
        self.backoff.reset()
        self.health.beat(ok=True)
        return self.idle_sleep_s if done == 0 else 0.0

    def _refresh_leases_when_due(self) -> None:
        if self.leases is not None and time.monotonic() >= self.next_renew:
            held = self.leases.refresh()
            self.next_renew = time.monotonic() + self.renew_every
            log.debug("%s holds %d shards", self.owner, len(held))
            metrics.measure_clock_skew(self.role)

    def _failed(self, exc: Exception) -> float:
        """Called while `exc` is being handled (log.exception needs it)."""
        dependency = outage_of(exc)
        if dependency is None:
            # A bug or a poison row: log it in full, count the failure, go on.
            log.exception("%s: unit of work failed; retrying", self.owner)
            self.health.beat(ok=False)
            drop_database_connection()
            return self.idle_sleep_s
        self.outage.failed(dependency, exc)
        self.health.beat(ok=False, detail=f"{dependency} unavailable")
        metrics.outage_retries.labels(role=self.role, dependency=dependency).inc()
        if dependency is Dependency.DATABASE:
            drop_database_connection()
            self.next_renew = 0.0  # re-check the leases first thing when it is back
        return self.backoff.next_delay()
