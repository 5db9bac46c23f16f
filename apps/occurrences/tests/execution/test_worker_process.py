"""Execution with real processes: Celery workers consuming real RabbitMQ queues, plus the relay
and the reaper where recovery needs them. Nothing is mocked or eager.

Timings are printed (`pytest -s`): time to recovery after a SIGKILL is reported.
"""

from __future__ import annotations

import os
import pathlib
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import amqp
import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone
from kombu.serialization import dumps

from apps.occurrences.models import Attempt, HandlerEffect, Occurrence
from apps.occurrences.pipeline.queues import (
    LANES,
    QUEUE_ARGUMENTS,
    TASK_NAME,
    exchange_name,
    queue_name,
    tenant_partition,
)
from apps.occurrences.tests.support.processes import ROOT, database_url
from apps.occurrences.tests.support.rows import occurrence, schedule, state_of
from apps.tenants.models import Tenant

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

LEASE_S = 2


class Stack:
    """Processes started by one test; stopped (and continued, if stopped) at teardown."""

    def __init__(self, prefix: str, tmp: Path) -> None:
        self.prefix, self.tmp = prefix, tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url(connection.settings_dict),
            "TICK_QUEUE_PREFIX": prefix,
            "TICK_ATTEMPT_LEASE_S": str(LEASE_S),
            "TICK_LEASE_TTL_S": "3",
            "DJANGO_DEBUG": "1",
            "PYTHONUNBUFFERED": "1",
        }

    def start(self, *names: str) -> None:
        py = sys.executable
        commands = {
            "worker": [
                py, "-m", "celery", "-A", "tickweb", "worker", "--pool", "prefork",
                "--concurrency", "2", "--loglevel", "INFO", "--hostname", f"{self.prefix}@%h",
                "--without-gossip", "--without-mingle", "--without-heartbeat",
            ],
            "relay": [py, "manage.py", "relay", "--idle-sleep", "0.05"],
            "reap": [py, "manage.py", "reap", "--interval", "0.25", "--grace", "0"],
        }  # fmt: skip
        for name in names:
            log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed by the process end
            self.procs[name] = subprocess.Popen(
                commands[name], cwd=ROOT, env=self.env, stdout=log, stderr=log,
                start_new_session=True,
            )  # fmt: skip

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for name, proc in self.procs.items():
            os.killpg(proc.pid, signal.SIGCONT)
            # Workers: cold shutdown (SIGQUIT) — unacked messages return to queues that the
            # queue_prefix fixture deletes anyway; a warm shutdown costs ~7 s per test.
            proc.send_signal(signal.SIGQUIT if name == "worker" else signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            sys.stdout.write(f"--- {name} log (tail) ---\n{self.log(name)[-2500:]}\n")


@pytest.fixture
def stack(queue_prefix: str, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(queue_prefix, tmp_path)
    yield s
    s.stop()


@pytest.fixture
def channel(queue_prefix: str) -> Iterator[Any]:
    """A py-amqp channel with the prefix's topology declared (as the relay declares it)."""
    conn = amqp.Connection(host="127.0.0.1:5672", userid="guest", password="guest")
    conn.connect()
    ch = conn.channel()
    exchange = exchange_name(queue_prefix)
    ch.exchange_declare(exchange, "direct", durable=True, auto_delete=False)
    for lane in LANES:
        for p in range(settings.TICK_TENANT_PARTITIONS):
            name = queue_name(queue_prefix, lane, p)
            ch.queue_declare(name, durable=True, auto_delete=False, arguments=dict(QUEUE_ARGUMENTS))
            ch.queue_bind(name, exchange, routing_key=name)
    yield ch
    conn.close()


def _publish(
    ch: Any, prefix: str, occ: Occurrence, *, serializer: str = "json", **extra: Any
) -> str:
    """Publish one `tick.run_occurrence` message for `occ`, as Celery builds it."""
    from tickweb.celery import app

    queue = queue_name(
        prefix, "strict", tenant_partition(occ.tenant_id, settings.TICK_TENANT_PARTITIONS)
    )
    kwargs = {"occurrence_id": str(occ.id), "scheduled_for": occ.scheduled_for.isoformat(), **extra}
    task = app.amqp.as_task_v2(str(occ.id), TASK_NAME, args=(), kwargs=kwargs)
    content_type, encoding, body = dumps(task.body, serializer=serializer)
    ch.basic_publish(
        amqp.Message(body=body, content_type=content_type, content_encoding=encoding,
                     application_headers=dict(task.headers), delivery_mode=2,
                     correlation_id=str(occ.id)),
        exchange=exchange_name(prefix), routing_key=queue,
    )  # fmt: skip
    return queue


def _wait(predicate: Callable[[], Any], timeout: float, what: str, stack: Stack) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        for name, proc in stack.procs.items():
            assert proc.poll() is None, f"{name} exited with {proc.returncode}"
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _attempt_pid(occ: Occurrence, attempt_no: int) -> int | None:
    attempt = Attempt.objects.filter(occurrence_id=occ.id, attempt_no=attempt_no).first()
    return int(attempt.worker_id.rsplit(":", 1)[1]) if attempt else None


def _outcomes(occ: Occurrence) -> list[str]:
    rows = Attempt.objects.filter(occurrence_id=occ.id).order_by("attempt_no")
    return list(rows.values_list("outcome", flat=True))


def _first_attempt_sleeping(
    tenant: Tenant, stack: Stack, channel: Any, prefix: str, *, sleep_s: int
) -> tuple[Occurrence, int]:
    """An occurrence whose handler records its effect, then sleeps `sleep_s` on its first
    attempt; published with worker, relay and reaper running. Returns it and the pid of the
    pool process running attempt 1 once that attempt is inside its sleep."""
    occ = occurrence(
        schedule(tenant, payload={"sleep_s": sleep_s, "sleep_attempts": 1}), timezone.now()
    )
    stack.start("worker", "relay", "reap")
    _publish(channel, prefix, occ)
    pid = _wait(lambda: HandlerEffect.objects.filter(occurrence_id=occ.id).exists()
                and _attempt_pid(occ, 1), 30, "attempt 1 to run", stack)  # fmt: skip
    return occ, int(pid)


def test_same_message_delivered_twice_applies_the_effect_once(
    tenant_a, stack, channel, queue_prefix
):
    # given: one occurrence, and its message published twice (a relay crash after confirm)
    occ = occurrence(schedule(tenant_a, handler="record", payload={"twice": True}), timezone.now())
    stack.start("worker")
    _publish(channel, queue_prefix, occ)
    _publish(channel, queue_prefix, occ)

    # when: a real worker consumes both
    _wait(lambda: state_of(occ) == "SUCCEEDED", 30, "SUCCEEDED", stack)
    _wait(lambda: "duplicate" in stack.log("worker"), 10, "the duplicate to be dropped", stack)

    # then: one attempt, one effect, ran once
    assert _outcomes(occ) == ["SUCCEEDED"]
    effect = HandlerEffect.objects.get(occurrence_id=occ.id)
    assert effect.deliveries == 1


def test_worker_sigkilled_mid_handler_recovers_with_the_effect_once(
    tenant_a, stack, channel, queue_prefix
):
    # given: a handler that records its effect, then sleeps 30 s on its first attempt
    occ, pid = _first_attempt_sleeping(tenant_a, stack, channel, queue_prefix, sleep_s=30)

    # when: the pool process running it is SIGKILLed (what the OOM killer does)
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()

    # then: the reaper re-queues it through the outbox and it completes, effect once
    _wait(lambda: state_of(occ) == "SUCCEEDED", 30, "recovery", stack)
    recovery = time.monotonic() - killed_at
    sys.stdout.write(f"SIGKILL -> SUCCEEDED in {recovery:.2f}s (lease {LEASE_S}s)\n")
    assert _outcomes(occ) == ["LEASE_EXPIRED", "SUCCEEDED"]
    effect = HandlerEffect.objects.get(occurrence_id=occ.id)
    assert effect.deliveries == 2  # the handler ran twice; its effect exists once
    assert HandlerEffect.objects.filter(occurrence_id=occ.id).count() == 1
    assert recovery < LEASE_S + 8


def test_worker_stopped_past_its_lease_cannot_overwrite_the_newer_result(
    tenant_a, stack, channel, queue_prefix
):
    # given: attempt 1 runs a 4 s handler in a pool process
    occ, pid = _first_attempt_sleeping(tenant_a, stack, channel, queue_prefix, sleep_s=4)

    # when: that process is frozen (SIGSTOP) until attempt 2 has finished elsewhere
    os.kill(pid, signal.SIGSTOP)
    try:
        _wait(lambda: state_of(occ) == "SUCCEEDED", 30, "attempt 2 to succeed", stack)
        assert _attempt_pid(occ, 2) != pid
    finally:
        os.kill(pid, signal.SIGCONT)

    # then: the resumed worker's completion is stale and ignored
    stale = f"occurrence {occ.id} attempt 1: stale"
    _wait(lambda: stale in stack.log("worker"), 15, "the stale completion", stack)
    occ.refresh_from_db()
    assert (occ.state, occ.attempt_count) == ("SUCCEEDED", 2)
    assert _outcomes(occ) == ["LEASE_EXPIRED", "SUCCEEDED"]
    assert HandlerEffect.objects.filter(occurrence_id=occ.id).count() == 1


class _TouchOnLoad:
    """Unpickling this creates a file: proof that a pickle was (or was not) deserialized."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (pathlib.Path.touch, (pathlib.Path(self.path),))


def test_pickle_serialized_message_is_not_executed(
    tenant_a, stack, channel, queue_prefix, tmp_path
):
    # given: a pickled task message for a real occurrence, carrying a payload that would
    # create a file if it were ever unpickled
    marker = tmp_path / "unpickled"
    poisoned = occurrence(schedule(tenant_a, name="pickle"), timezone.now())
    witness = occurrence(schedule(tenant_a, name="json"), timezone.now())
    stack.start("worker")
    assert pickle.loads(pickle.dumps(_TouchOnLoad(tmp_path / "selftest"))) is None
    assert (tmp_path / "selftest").exists()  # the gadget works when unpickled
    queue = _publish(channel, queue_prefix, poisoned, serializer="pickle", x=_TouchOnLoad(marker))

    # when: a JSON message follows on the same queue, so the worker has surely seen the first
    _publish(channel, queue_prefix, witness)
    _wait(lambda: state_of(witness) == "SUCCEEDED", 30, "the JSON message to run", stack)

    # then: the pickled one was refused before deserialization: not run, not unpickled
    assert not marker.exists()
    assert state_of(poisoned) == "ENQUEUED"
    assert not Attempt.objects.filter(occurrence_id=poisoned.id).exists()
    assert not HandlerEffect.objects.filter(occurrence_id=poisoned.id).exists()
    log = stack.log("worker")
    assert "pickle" in log and ("Refusing" in log or "ContentDisallowed" in log), log[-2000:]
    assert channel.queue_declare(queue, passive=True).message_count == 0
