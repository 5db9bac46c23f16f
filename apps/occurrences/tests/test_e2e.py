"""End to end with real processes: API -> materialize -> relay -> RabbitMQ -> Celery worker.

Nothing is mocked or eager: three subprocesses run the commands `make run` starts, against
the test database and the real broker (on a private queue prefix).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from apps.occurrences.models import Attempt, HandlerEffect, Occurrence
from apps.occurrences.tests.process_stack import database_url

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def stack(queue_prefix, tmp_path):
    """materialize, relay and a Celery worker as real processes; stopped with SIGTERM."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url(connection.settings_dict),
        "TICK_QUEUE_PREFIX": queue_prefix,
        "DJANGO_DEBUG": "1",
        "PYTHONUNBUFFERED": "1",
    }
    python = sys.executable
    commands = {
        "materialize": [python, "manage.py", "materialize", "--idle-sleep", "0.2"],
        "relay": [python, "manage.py", "relay", "--idle-sleep", "0.05"],
        "worker": [
            python, "-m", "celery", "-A", "tickweb", "worker", "--concurrency", "2",
            "--loglevel", "INFO", "--hostname", f"e2e-{queue_prefix}@%h",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ],
    }  # fmt: skip
    procs = {}
    for name, cmd in commands.items():
        log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        procs[name] = (subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log), log)
    yield procs
    for proc, _ in procs.values():
        proc.send_signal(signal.SIGTERM)
    for name, (proc, log) in procs.items():
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        sys.stdout.write(f"--- {name} log (tail) ---\n")
        sys.stdout.write((tmp_path / f"{name}.log").read_text(errors="replace")[-3000:])


def test_schedule_created_through_the_api_runs_on_a_real_worker(api_a, tenant_a, stack):
    # given: a one-shot due in a few seconds, created through the API
    run_at = timezone.now() + timedelta(seconds=6)
    response = api_a.post(
        "/api/v1/schedules",
        {
            "name": "e2e",
            "kind": "one_shot",
            "run_at": run_at.isoformat(),
            "time_zone": "Europe/Berlin",
            "handler": "record",
            "payload": {"e2e": True},
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    schedule_id = response.json()["id"]

    # when: the processes do their work
    deadline = time.monotonic() + 60
    occurrence = None
    while time.monotonic() < deadline:
        occurrence = Occurrence.objects.filter(schedule_id=schedule_id).first()
        if occurrence is not None and occurrence.state == Occurrence.State.SUCCEEDED:
            break
        for name, (proc, _) in stack.items():
            assert proc.poll() is None, f"{name} exited with {proc.returncode}"
        time.sleep(0.25)

    # then: one occurrence, one attempt, one effect, enqueued within the SLO
    assert occurrence is not None, "no occurrence was materialized"
    assert occurrence.state == Occurrence.State.SUCCEEDED, occurrence.state
    assert occurrence.attempt_count == 1
    attempts = Attempt.objects.filter(occurrence_id=occurrence.id)
    assert [a.outcome for a in attempts] == [Attempt.Outcome.SUCCEEDED]
    assert occurrence.enqueued_at is not None
    lag = (occurrence.enqueued_at - occurrence.scheduled_for).total_seconds()
    assert 0 <= lag < 5, f"lag {lag:.3f}s"
    effect = HandlerEffect.objects.get(occurrence_id=occurrence.id)
    assert effect.deliveries == 1 and effect.payload == {"e2e": True}
    sys.stdout.write(f"e2e lag enqueued_at - scheduled_for = {lag:.3f}s\n")
