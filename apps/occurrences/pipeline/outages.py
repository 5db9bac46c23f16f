"""Riding out database and broker outages (docs/operations.md, "Outages").

Every long-running process (materialize, relay, reap, the Celery worker's tasks) treats a
database or broker that is unreachable, restarting or resetting connections as weather, not
as a fault: it retries with capped, jittered backoff, logs the outage once when it starts and
once when it ends, reports unready while it lasts, and resumes by itself. Only errors that no
retry can fix (a missing table, bad settings) end a process.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from enum import StrEnum
from typing import TypeVar

import amqp.exceptions
import kombu.exceptions
from django import db

from apps.occurrences.observability import metrics

log = logging.getLogger(__name__)

T = TypeVar("T")


class Dependency(StrEnum):
    DATABASE = "database"
    BROKER = "broker"


_DATABASE_ERRORS: tuple[type[BaseException], ...] = (db.OperationalError, db.InterfaceError)
_BROKER_ERRORS: tuple[type[BaseException], ...] = (
    amqp.exceptions.ConnectionError,
    amqp.exceptions.RecoverableConnectionError,
    kombu.exceptions.OperationalError,
    OSError,  # refused, reset, timed out, name resolution: the socket layer under AMQP
)


def outage_of(exc: BaseException) -> Dependency | None:
    """Which dependency an error says is unavailable, or None for any other error."""
    if isinstance(exc, _DATABASE_ERRORS):
        return Dependency.DATABASE
    if isinstance(exc, _BROKER_ERRORS):
        return Dependency.BROKER
    return None


def drop_database_connection() -> None:
    """Forget this thread's connection after an error: a connection the server terminated
    raises again on next use, while a new one succeeds once the server is back."""
    try:
        db.connection.close()
    except Exception:  # noqa: BLE001 - closing an already broken connection
        log.debug("error closing a broken database connection", exc_info=True)


class Backoff:
    """Capped exponential backoff, each delay drawn from the upper half of its ceiling
    (jitter: many processes must not retry in step)."""

    def __init__(self, *, base_s: float = 0.25, cap_s: float = 2.0) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self.failures = 0
        # Seeded on the first failure: a worker makes two of these per occurrence, and
        # seeding reads the OS's entropy.
        self._rng: random.Random | None = None

    def next_delay(self) -> float:
        self.failures += 1
        ceiling = min(self.cap_s, self.base_s * 2 ** min(self.failures, 16))
        if self._rng is None:
            self._rng = random.Random()  # noqa: S311 - jitter, not security
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.failures = 0


class OutageTracker:
    """Logs each outage once at its start and once at its end, with how long it lasted."""

    def __init__(self, who: str) -> None:
        self.who = who
        self.since: dict[Dependency, float] = {}

    @property
    def down(self) -> bool:
        return bool(self.since)

    def failed(self, dependency: Dependency, exc: BaseException) -> None:
        if dependency not in self.since:
            self.since[dependency] = time.monotonic()
            log.warning("%s: %s unavailable (%s: %s); retrying with backoff", self.who,
                        dependency, type(exc).__name__, str(exc).strip()[:200])  # fmt: skip

    def recovered(self) -> None:
        for dependency, since in self.since.items():
            log.warning("%s: %s back after %.1f s", self.who, dependency, time.monotonic() - since)
        self.since.clear()


def call_through_outages(fn: Callable[[], T], *, who: str, role: str, give_up_after_s: float) -> T:
    """Call `fn` until it succeeds, retrying database and broker outages with backoff.

    Other errors propagate at once. After `give_up_after_s` of outage the last outage error
    propagates too, so the caller can hand the work back (e.g. requeue a message).
    """
    backoff = Backoff()
    tracker = OutageTracker(who)
    started = time.monotonic()
    while True:
        try:
            result = fn()
        except Exception as exc:
            dependency = outage_of(exc)
            if dependency is None:
                raise
            tracker.failed(dependency, exc)
            metrics.outage_retries.labels(role=role, dependency=dependency).inc()
            if dependency is Dependency.DATABASE:
                drop_database_connection()
            delay = backoff.next_delay()
            if time.monotonic() - started + delay > give_up_after_s:
                raise
            time.sleep(delay)
            continue
        tracker.recovered()
        return result
