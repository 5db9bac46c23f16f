"""A PostgreSQL restart in the middle of a burst loses nothing (real processes).

Everything runs against a private PostgreSQL cluster (own data directory and port, see
support/private_postgres.py) so the restart never touches the machine's shared server;
RabbitMQ is the shared node on a private queue prefix. Two materializers, two relays, two
workers and a reaper run as in production; the cluster is stopped (every connection
terminated) while the workers are claiming the burst, and started again two seconds later.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from apps.occurrences.tests.support.private_postgres import PrivatePostgres
from apps.occurrences.tests.support.processes import ROOT, ProcessStack, stack_env

pytestmark = [pytest.mark.e2e]

BURST = 300

CREATE_BURST = """
import sys
from datetime import datetime
from apps.schedules.models import Schedule
from apps.schedules.services import ScheduleSpec, schedule_create
from apps.tenants.models import Tenant
run_at = datetime.fromisoformat(sys.argv[1])
count, label = int(sys.argv[2]), sys.argv[3]
tenants = [Tenant.objects.get_or_create(slug=f"fault-{i}", defaults={"name": f"t{i}"})[0]
           for i in range(3)]
for n in range(count):
    schedule_create(tenant=tenants[n % 3], actor="test", spec=ScheduleSpec(
        name=f"{label}-{n}", kind=Schedule.Kind.ONE_SHOT, run_at=run_at, time_zone="UTC",
        handler="record", payload={"n": n}))
"""


def _manage(env: dict[str, str], *args: str) -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _create_burst(env: dict[str, str], run_at: datetime, count: int, label: str) -> None:
    _manage(env, "shell", "-c", f"import sys; sys.argv = ['x', {run_at.isoformat()!r}, "
            f"'{count}', {label!r}]\n" + CREATE_BURST)  # fmt: skip


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    pg = PrivatePostgres()
    pg.init()
    yield pg
    pg.destroy()


def _burst_states(pg: PrivatePostgres, label: str) -> dict[str, int]:
    with psycopg.connect(pg.dsn(), connect_timeout=3) as conn:
        rows = conn.execute(
            """
            SELECT o.state, count(*) FROM occurrences_occurrence o
            JOIN schedules_schedule s ON s.id = o.schedule_id
            WHERE s.name LIKE %s GROUP BY o.state
            """,
            [f"{label}-%"],
        ).fetchall()
    return {state: int(n) for state, n in rows}


def _wait_all_succeeded(
    pg: PrivatePostgres, stack: ProcessStack, label: str, count: int, timeout_s: float
) -> float:
    """Seconds until `count` occurrences of the burst SUCCEEDED (fails past timeout)."""
    started = time.monotonic()
    states: dict[str, int] = {}
    while time.monotonic() - started < timeout_s:
        try:
            states = _burst_states(pg, label)
        except psycopg.OperationalError:
            states = {}
        if states.get("SUCCEEDED") == count:
            return time.monotonic() - started
        time.sleep(0.5)
    stack.assert_alive()
    raise AssertionError(f"{label}: after {timeout_s:.0f} s states are {states}")


def _deliveries(pg: PrivatePostgres, label: str) -> list[int]:
    """How often the handler's effect was delivered, per occurrence of the burst."""
    with psycopg.connect(pg.dsn()) as conn:
        rows = conn.execute(
            """
            SELECT COALESCE(e.deliveries, 0) FROM occurrences_occurrence o
            JOIN schedules_schedule s ON s.id = o.schedule_id
            LEFT JOIN occurrences_handlereffect e ON e.occurrence_id = o.id
            WHERE s.name LIKE %s
            """,
            [f"{label}-%"],
        ).fetchall()
    return [int(row[0]) for row in rows]


def _wait_first_attempts(pg: PrivatePostgres, label: str, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = _burst_states(pg, label)
        started = sum(n for s, n in states.items() if s not in ("SCHEDULED", "ENQUEUED"))
        if started:
            return started
        time.sleep(0.05)
    raise AssertionError(f"no attempt of {label} started: {_burst_states(pg, label)}")


def test_postgres_restart_during_a_burst_loses_nothing(
    private_pg: PrivatePostgres, queue_prefix: str, tmp_path: Path, settings
) -> None:
    # given: Tick migrated on the private cluster, the whole engine running against it
    env = stack_env(
        database_url=private_pg.url,
        broker_url=settings.CELERY_BROKER_URL,
        queue_prefix=queue_prefix,
        # Handlers that sleep a little keep the workers busy claiming during the restart.
        TICK_REDELIVER_AFTER_S="600",
    )
    _manage(env, "migrate", "--noinput")
    _manage(env, "partitions")
    stack = ProcessStack(tmp_path, env)
    for n in (1, 2):
        stack.start_role("materialize", name=f"materialize-{n}")
        stack.start_role("relay", name=f"relay-{n}")
        stack.start_role("worker", name=f"worker-{n}", concurrency=2)
    stack.start_role("reap", name="reap")
    try:
        instant = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=20)
        _create_burst(env, instant, BURST, "burst")

        # when: the cluster restarts while the workers are claiming the burst
        _wait_first_attempts(private_pg, "burst", timeout_s=60)
        outage = private_pg.restart(down_s=2.0)

        # then: every occurrence of the burst succeeds, each effect exactly once
        recovery = _wait_all_succeeded(private_pg, stack, "burst", BURST, timeout_s=120)
        assert _deliveries(private_pg, "burst") == [1] * BURST

        # and every process rode it out, the materializer included: a burst created after
        # the restart is materialized, relayed and run as well
        stack.assert_alive()
        after = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=8)
        _create_burst(env, after, 30, "after")
        second = _wait_all_succeeded(private_pg, stack, "after", 30, timeout_s=60)
        stack.assert_alive()
        # each loop logged the outage once and its end once
        for name in stack.procs:
            if name.startswith(("materialize", "relay", "reap")):
                log = stack.log_text(name)
                assert log.count("database unavailable") == 1, stack.log_tail(name)
                assert log.count("database back after") == 1, stack.log_tail(name)
        sys.stdout.write(
            f"database refused connections for {outage:.1f} s; the burst of {BURST} all "
            f"SUCCEEDED {recovery:.1f} s after the server was back; a burst created after "
            f"the restart ran in {second:.1f} s\n"
        )
    finally:
        stack.stop_all()
