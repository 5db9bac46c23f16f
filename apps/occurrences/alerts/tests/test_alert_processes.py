"""Alerts through the real processes: the reaper groups and publishes them to RabbitMQ, a
Celery worker sends them. A worker killed while sending leaves the message unacknowledged;
RabbitMQ redelivers it and the next worker sends it again with the same alert id."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from apps.occurrences.alerts.deliver import ALERT_ID_HEADER
from apps.occurrences.alerts.tests.support import channel, dead_occurrence, receiver, rule
from apps.occurrences.models import Alert, AlertChannel, AlertDelivery
from apps.occurrences.tests.support.processes import ROOT, database_url

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


class Processes:
    def __init__(self, prefix: str, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {
            **os.environ, "DATABASE_URL": database_url(connection.settings_dict),
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL, "TICK_QUEUE_PREFIX": prefix,
            "TICK_WEBHOOK_ALLOWLIST": "127.0.0.1/32", "TICK_ALERT_COALESCE_S": "0",
            "DJANGO_DEBUG": "1", "PYTHONUNBUFFERED": "1",
        }  # fmt: skip
        self.prefix = prefix

    def start(self, name: str) -> None:
        py = sys.executable
        argv = (
            [py, "-m", "celery", "-A", "tickweb", "worker", "--pool", "prefork",
             "--concurrency", "1", "--loglevel", "INFO", "--hostname", f"{name}-{self.prefix}@%h",
             "--without-gossip", "--without-mingle", "--without-heartbeat"]
            if name.startswith("worker")
            else [py, "manage.py", "reap", "--interval", "0.25"]
        )  # fmt: skip
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        self.procs[name] = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=log,
                                            stderr=log, start_new_session=True)  # fmt: skip

    def kill(self, name: str) -> None:
        os.killpg(self.procs[name].pid, signal.SIGKILL)
        self.procs[name].wait()

    def stop(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGQUIT if name.startswith("worker") else signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            text = (self.tmp / f"{name}.log").read_text(errors="replace")
            sys.stdout.write(f"--- {name} log (tail) ---\n{text[-2000:]}\n")


@pytest.fixture
def processes(queue_prefix: str, tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(queue_prefix, tmp_path)
    yield procs
    procs.stop()


@pytest.fixture
def hook(settings):
    settings.TICK_WEBHOOK_ALLOWLIST = ["127.0.0.1/32"]
    yield from receiver()


def _wait(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_dead_occurrence_alerts_once_even_when_the_sending_worker_dies(tenant_a, hook, processes):
    rule(channel(tenant_a, f"http://127.0.0.1:{hook.server_port}/a", AlertChannel.Kind.WEBHOOK))
    dead_occurrence(tenant_a)
    hook.hold.set()  # the receiver answers nothing until the test lets it

    processes.start("reap")
    processes.start("worker-1")
    assert hook.arrived.wait(60), "the first worker never sent the alert"
    processes.kill("worker-1")  # mid-send: its message was never acknowledged
    hook.hold.clear()
    hook.release.set()
    processes.start("worker-2")

    _wait(lambda: AlertDelivery.objects.filter(state=AlertDelivery.State.SENT).exists(), 90,
          "the redelivered alert to be sent")  # fmt: skip

    delivery = AlertDelivery.objects.get()
    assert Alert.objects.count() == 1 and delivery.alert_count == 1
    assert len(hook.requests) >= 2  # sent again after the crash …
    ids = {request["headers"][ALERT_ID_HEADER] for request in hook.requests}
    assert ids == {str(delivery.id)}  # … as the same alert, which the receiver deduplicates
    time.sleep(1.5)  # nothing more arrives: the message is acknowledged now
    assert len({r["headers"][ALERT_ID_HEADER] for r in hook.requests}) == 1
    assert AlertDelivery.objects.count() == 1
