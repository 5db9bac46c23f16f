"""Health (liveness) and readiness per process kind (docs/operations.md "Endpoints per
process kind").

- web (gunicorn): `/healthz` answers 200 while the process serves requests; `/readyz` also
  runs `SELECT 1` (the web needs only the database). Metrics: `/metrics` (django-prometheus,
  aggregated over gunicorn workers in multiprocess mode, docs/operations.md).
- materialize / relay / reap: their `--metrics-port` serves `/metrics`, `/healthz` and
  `/readyz` from one small HTTP server thread. The loop calls `beat(ok=...)` after each unit
  of work: `/healthz` fails when the loop has not beaten for `stale_after_s` (wedged), and
  `/readyz` fails until the first successful unit and after a failed one.
- Celery workers: `tickweb/celery.py` starts the same server on `TICK_WORKER_METRICS_PORT`
  in the parent process; ready once Celery reports `worker_ready`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from django.db import connection
from django.http import HttpRequest, JsonResponse
from prometheus_client import REGISTRY, CollectorRegistry, make_wsgi_app

StartResponse = Callable[..., Any]


class ProcessHealth:
    """Liveness from the loop's beats; readiness from the last unit of work, or from
    `probe` (called at most every `probe_every_s`) for a process with no loop of its own."""

    def __init__(
        self,
        kind: str,
        stale_after_s: float = 60.0,
        probe: Callable[[], bool] | None = None,
        probe_every_s: float = 2.0,
    ) -> None:
        self.kind = kind
        self.stale_after_s = stale_after_s
        self.last_beat = time.monotonic()
        self.ready = False
        self.detail = "starting"
        self.probe = probe
        self.probe_every_s = probe_every_s
        self._probed_at = -float("inf")
        self._lock = threading.Lock()

    def is_ready(self) -> bool:
        if self.probe is None:
            return self.ready
        with self._lock:
            if time.monotonic() - self._probed_at >= self.probe_every_s:
                try:
                    self.ready = self.probe()
                except Exception:  # noqa: BLE001 - a failing probe means not ready
                    self.ready = False
                self._probed_at = time.monotonic()
            return self.ready

    def beat(self, *, ok: bool, detail: str = "") -> None:
        self.last_beat = time.monotonic()
        self.ready = ok
        self.detail = detail or ("ok" if ok else "last unit of work failed")

    def live(self) -> bool:
        return time.monotonic() - self.last_beat < self.stale_after_s


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
        pass


class _ThreadingServer(WSGIServer):
    daemon_threads = True


def process_app(
    health: ProcessHealth, registry: CollectorRegistry = REGISTRY
) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path in ("/healthz", "/readyz"):
            ok = health.live() if path == "/healthz" else health.live() and health.is_ready()
            status = "200 OK" if ok else "503 Service Unavailable"
            body = f'{{"kind": "{health.kind}", "ok": {str(ok).lower()}}}'.encode()
            start_response(status, [("Content-Type", "application/json")])
            return [body]
        return metrics_app(environ, start_response)  # type: ignore[no-any-return]

    return app


def serve_process(
    port: int,
    health: ProcessHealth,
    *,
    addr: str = "127.0.0.1",
    registry: CollectorRegistry = REGISTRY,
) -> WSGIServer:
    """Serve /metrics, /healthz and /readyz on `port` from a daemon thread."""
    server = make_server(
        addr, port, process_app(health, registry), _ThreadingServer, handler_class=_Quiet
    )
    threading.Thread(target=server.serve_forever, name="tick-health", daemon=True).start()
    return server


def healthz(request: HttpRequest) -> JsonResponse:
    """Web liveness: the process answers."""
    return JsonResponse({"kind": "web", "ok": True})


def readyz(request: HttpRequest) -> JsonResponse:
    """Web readiness: the database answers."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - any database failure means not ready
        return JsonResponse({"kind": "web", "ok": False, "error": type(exc).__name__}, status=503)
    return JsonResponse({"kind": "web", "ok": True})
