"""Health and readiness endpoints of the web process and of the long-running processes."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from django.test import Client

from apps.occurrences.observability.health import ProcessHealth, serve_process


@pytest.mark.django_db
def test_web_health_and_readiness_answer_200() -> None:
    client = Client()

    assert client.get("/healthz").json() == {"kind": "web", "ok": True}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"kind": "web", "ok": True}


def _get(port: int, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_process_port_serves_metrics_health_and_readiness() -> None:
    health = ProcessHealth("relay", stale_after_s=60)
    server = serve_process(0, health)
    port = server.server_port
    try:
        # starting: alive, not ready
        assert _get(port, "/healthz")[0] == 200
        assert _get(port, "/readyz")[0] == 503
        health.beat(ok=True)
        status, body = _get(port, "/readyz")
        assert (status, json.loads(body)) == (200, {"kind": "relay", "ok": True})
        health.beat(ok=False)
        assert _get(port, "/readyz")[0] == 503
        # a wedged loop: no beat for longer than stale_after_s
        health.stale_after_s = 0
        assert _get(port, "/healthz")[0] == 503
        status, body = _get(port, "/metrics")
        assert status == 200
        assert "tick_schedule_lag_seconds_bucket" in body
    finally:
        server.shutdown()


def test_celery_worker_serves_summed_child_metrics(tmp_path: Any, monkeypatch: Any, db) -> None:
    import socket
    from types import SimpleNamespace

    from django.conf import settings
    from kombu import Connection

    from tickweb import celery as tick_celery

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setenv("TICK_WORKER_METRICS_PORT", str(port))
    (tmp_path / "counter_1.db").write_bytes(b"")  # a stale file of an earlier run
    broker = Connection(settings.CELERY_BROKER_URL)
    broker.connect()
    consumer = SimpleNamespace(connection=broker)

    tick_celery._clear_multiproc_dir()
    tick_celery._serve_worker_metrics(sender=consumer)

    assert list(tmp_path.iterdir()) == []
    assert _get(port, "/readyz")[0] == 200
    assert _get(port, "/metrics")[0] == 200
    # the consumer lost its broker: unready (once the cached probe result is stale)
    broker.release()
    time.sleep(2.1)
    assert _get(port, "/readyz")[0] == 503
