"""The Celery application: workers run occurrences' handlers (apps/occurrences/execution/)."""

from __future__ import annotations

import math
import os
import time
from typing import TYPE_CHECKING, Any

from celery import Celery, signals

if TYPE_CHECKING:
    from apps.occurrences.execution.presence import PresenceBeat

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tickweb.settings")

app = Celery("tickweb")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["apps.occurrences.execution", "apps.occurrences.alerts"])


@app.on_after_configure.connect
def _declare_queues(sender: Celery, **_: object) -> None:
    """Workers consume every lane x tenant-partition queue (apps/occurrences/pipeline/queues.py).
    Built here, once settings are loaded, so that settings.py imports no app module."""
    from django.conf import settings

    from apps.occurrences.pipeline.queues import celery_queues

    sender.conf.task_queues = celery_queues(
        settings.TICK_QUEUE_PREFIX, settings.TICK_TENANT_PARTITIONS
    )


@signals.worker_init.connect
def _worker_connection_age(**_: object) -> None:
    """A worker's connections live TICK_WORKER_CONN_MAX_AGE, not the web's CONN_MAX_AGE: at
    60 s each pool process opened a new backend every minute, which loads its caches and
    prepares the claim's statements again (docs/decisions.md "Workers keep their database
    connection"). Set before the pool forks, so every pool process and thread inherits it."""
    from django.conf import settings
    from django.db import DEFAULT_DB_ALIAS, connections

    connections.settings[DEFAULT_DB_ALIAS]["CONN_MAX_AGE"] = settings.TICK_WORKER_CONN_MAX_AGE


@signals.task_postrun.connect
def _close_old_connections(**_: object) -> None:
    """After each task, what Django does after each request: close a connection that is
    older than its CONN_MAX_AGE (the worker's, above) or unusable after an error
    (settings.CELERY_DB_REUSE_MAX)."""
    global _last_task_end
    from django.db import close_old_connections

    close_old_connections()
    _last_task_end = time.monotonic()


# A connection that served a task less than this long ago is not health-checked before the
# next one (Django's CONN_HEALTH_CHECKS would send `SELECT 1` before every task's first
# statement). Under load that is a round trip per occurrence that finds nothing the claim
# would not: the claim and the completion ride out a broken connection themselves (dropped
# and retried, apps/occurrences/pipeline/outages.py). An idle connection, the one a restart
# or an idle timeout ends, is still checked (docs/decisions.md "Workers keep their database
# connection").
HEALTH_CHECK_AFTER_IDLE_S = 1.0
_last_task_end = -math.inf


@signals.task_prerun.connect
def _skip_health_check_when_busy(**_: object) -> None:
    from django.db import connection

    if (
        connection.connection is not None
        and time.monotonic() - _last_task_end < HEALTH_CHECK_AFTER_IDLE_S
    ):
        connection.health_check_done = True  # type: ignore[attr-defined]


# --- observability ----------------------------------------------------------------------
# Prefork workers observe metrics in child processes. With PROMETHEUS_MULTIPROC_DIR set
# (before the worker starts), each child writes its samples to that directory and the parent
# serves the sum on TICK_WORKER_METRICS_PORT (/metrics, /healthz, /readyz). Without it (e.g.
# --pool solo/threads) the parent's own registry is served.
def _worker_metrics_port() -> int:
    return int(os.environ.get("TICK_WORKER_METRICS_PORT", "0") or 0)


@signals.worker_init.connect
def _clear_multiproc_dir(**_: object) -> None:
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        os.makedirs(directory, exist_ok=True)
        for name in os.listdir(directory):
            if name.endswith(".db"):
                os.remove(os.path.join(directory, name))


def _worker_ready_probe(consumer: object) -> bool:
    """Ready while the consumer's broker connection is up and the database answers."""
    import psycopg
    from django.db import connection

    broker = getattr(consumer, "connection", None)
    if broker is None or not broker.connected:
        return False
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("server_side_binding", None)
    params["connect_timeout"] = 2
    with psycopg.connect(**params) as probe:
        probe.execute("SELECT 1")
    return True


@signals.worker_ready.connect
def _serve_worker_metrics(sender: object = None, **_: object) -> None:
    global _worker_health
    port = _worker_metrics_port()
    if not port:
        return
    from prometheus_client import REGISTRY, CollectorRegistry, multiprocess

    from apps.occurrences.observability.health import ProcessHealth, serve_process

    registry = REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    # The parent process only supervises: once ready it stays live until shutdown, and is
    # unready while its broker connection or the database is down.
    _worker_health = ProcessHealth(
        "worker", stale_after_s=float("inf"), probe=lambda: _worker_ready_probe(sender)
    )
    _worker_health.beat(ok=True)
    serve_process(port, _worker_health, registry=registry)


# --- presence ---------------------------------------------------------------------------
# The main process announces the worker's slots (the pool's concurrency) while it runs, so
# claims can bound each tenant by its share of the live capacity
# (apps/occurrences/execution/presence.py); a clean shutdown withdraws them at once.
@signals.worker_ready.connect
def _announce_worker_presence(sender: Any = None, **_: object) -> None:
    global _worker_presence
    if _worker_presence is not None and _worker_presence.is_alive():
        return
    from django.conf import settings

    from apps.occurrences.execution.presence import PresenceBeat

    # The pool's limit: --concurrency for prefork and threads, 1 for solo.
    slots = int(getattr(getattr(sender, "pool", None), "limit", 0) or 1)
    _worker_presence = PresenceBeat(
        hostname=str(getattr(sender, "hostname", "") or "worker"),
        slots=slots,
        interval_s=settings.TICK_WORKER_PRESENCE_INTERVAL_S,
    )
    _worker_presence.start()


@signals.worker_shutdown.connect
def _withdraw_worker_presence(**_: object) -> None:
    if _worker_presence is not None:
        _worker_presence.stop()


@signals.worker_process_shutdown.connect
def _mark_child_dead(pid: int | None = None, **_: object) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid())  # type: ignore[no-untyped-call]


_worker_health: object = None
_worker_presence: PresenceBeat | None = None
