"""PostgreSQL as production runs it: a primary that fails over under Patroni (real processes).

A private cluster (scripts/patroni_cluster.py: one etcd, two PostgreSQL 15 nodes under
Patroni with `synchronous_mode`, HAProxy routing to the leader by Patroni's REST checks) on
its own ports and directories; Tick's engine — two materializers, two relays, two workers, a
reaper — connects through HAProxy; RabbitMQ is the shared node on a private queue prefix.
In the middle of a 300-occurrence strict burst (runs executing) the leader's postmaster is
SIGKILLed and the synchronous standby promotes; then a planned `patronictl switchover`.
Nothing is lost, no effect doubles beyond same-id redeliveries, reconcile agrees, and the
old leader rejoins as a replica (pg_rewind) by itself. `-s` prints the timings.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest

from apps.occurrences.tests.support.processes import ROOT, ProcessStack, stack_env

pytestmark = [pytest.mark.e2e, pytest.mark.patroni, pytest.mark.timeout(600)]

BURST = 300
SCRIPT = ROOT / "scripts" / "patroni_cluster.py"

CREATE_BURST = """
import sys
from datetime import datetime
from django.db import transaction
from apps.schedules.models import Schedule
from apps.schedules.services import ScheduleSpec, schedule_create
from apps.tenants.models import Tenant
run_at = datetime.fromisoformat(sys.argv[1])
count, label = int(sys.argv[2]), sys.argv[3]
tenants = [Tenant.objects.get_or_create(slug=f"ha-{i}", defaults={"name": f"t{i}"})[0]
           for i in range(3)]
with transaction.atomic():  # one commit: each waits for the synchronous standby
  for n in range(count):
    schedule_create(tenant=tenants[n % 3], actor="test", spec=ScheduleSpec(
        name=f"{label}-{n}", kind=Schedule.Kind.ONE_SHOT, run_at=run_at, time_zone="UTC",
        handler="record", payload={"n": n}))
"""


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("patroni_cluster", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _create_burst(env: dict[str, str], run_at: datetime, count: int, label: str) -> None:
    _manage(env, "shell", "-c", f"import sys; sys.argv = ['x', {run_at.isoformat()!r}, "
            f"'{count}', {label!r}]\n" + CREATE_BURST)  # fmt: skip


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    module = _script()
    missing = module.missing_tools()
    if missing:
        pytest.skip(f"{', '.join(missing)} missing (make patroni installs them)")
    ha = module.PatroniCluster()
    try:
        began = time.monotonic()
        ha.start()
        sys.stdout.write(f"Patroni cluster up in {time.monotonic() - began:.1f} s ({ha.url})\n")
        yield ha
    except BaseException:
        sys.stdout.write(ha.logs_tail() + "\n")
        raise
    finally:
        ha.destroy()


@pytest.fixture(scope="module")
def migrated(cluster: Any) -> Any:
    env = stack_env(database_url=cluster.url, broker_url="amqp://unused", queue_prefix="x")
    _manage(env, "migrate", "--noinput")
    _manage(env, "partitions")
    return cluster


def _query(cluster: Any, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    with psycopg.connect(cluster.dsn(), connect_timeout=3) as conn:
        return conn.execute(sql, params).fetchall()


def _burst_states(cluster: Any, label: str) -> dict[str, int]:
    rows = _query(
        cluster,
        "SELECT o.state, count(*) FROM occurrences_occurrence o "
        "JOIN schedules_schedule s ON s.id = o.schedule_id WHERE s.name LIKE %s "
        "GROUP BY o.state",
        [f"{label}-%"],
    )
    return {state: int(n) for state, n in rows}


def _wait_states(
    cluster: Any, stack: ProcessStack, label: str, done: Any, timeout_s: float
) -> float:
    """Monotonic time at which `done(states)` first held (fails past the timeout)."""
    deadline = time.monotonic() + timeout_s
    states: dict[str, int] = {}
    while time.monotonic() < deadline:
        try:
            states = _burst_states(cluster, label)
        except psycopg.OperationalError:
            states = {}
        if done(states):
            return time.monotonic()
        time.sleep(0.2)
    stack.assert_alive()
    raise AssertionError(f"{label}: after {timeout_s:.0f} s states are {states}")


def _effects(cluster: Any, label: str) -> list[tuple[int, int]]:
    """Per occurrence of the burst: (handler effects delivered, attempts made)."""
    rows = _query(
        cluster,
        """
        SELECT COALESCE(e.deliveries, 0),
               (SELECT count(*) FROM occurrences_attempt a WHERE a.occurrence_id = o.id)
        FROM occurrences_occurrence o
        JOIN schedules_schedule s ON s.id = o.schedule_id
        LEFT JOIN occurrences_handlereffect e ON e.occurrence_id = o.id
        WHERE s.name LIKE %s
        """,
        [f"{label}-%"],
    )
    return [(int(d), int(a)) for d, a in rows]


def _first_commit_after(cluster: Any, label: str, wall: datetime) -> datetime:
    """The earliest attempt start or finish of the burst stamped after `wall` (the
    transaction's start, so at most the commit's time)."""
    rows = _query(
        cluster,
        """
        SELECT min(t) FROM occurrences_attempt a
        JOIN occurrences_occurrence o ON o.id = a.occurrence_id
        JOIN schedules_schedule s ON s.id = o.schedule_id,
        LATERAL (VALUES (a.started_at), (a.finished_at)) AS v(t)
        WHERE s.name LIKE %s AND t > %s
        """,
        [f"{label}-%", wall],
    )
    first = rows[0][0]
    assert isinstance(first, datetime), "no commit of the burst after the fault"
    return first


def _start_stack(
    cluster: Any, queue_prefix: str, tmp_path: Path, broker: str
) -> tuple[ProcessStack, dict[str, str]]:
    env = stack_env(
        database_url=cluster.url,
        broker_url=broker,
        queue_prefix=queue_prefix,
        TICK_REDELIVER_AFTER_S="600",
    )
    stack = ProcessStack(tmp_path, env)
    for n in (1, 2):
        stack.start_role("materialize", name=f"materialize-{n}")
        stack.start_role("relay", name=f"relay-{n}")
        stack.start_role("worker", name=f"worker-{n}", concurrency=2)
    stack.start_role("reap", name="reap")
    return stack, env


def _ride_out(
    cluster: Any, stack: ProcessStack, env: dict[str, str], label: str, fault: Any
) -> str:
    """A burst; `fault()` once its runs execute; then every check. Returns the timings."""
    # Creating 300 schedules takes tens of seconds on a loaded machine: a long lead.
    instant = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=60)
    _create_burst(env, instant, BURST, label)
    assert datetime.now(UTC) < instant, "the burst was created after its own instant"
    _wait_states(
        cluster, stack, label,
        lambda s: sum(n for k, n in s.items() if k not in ("SCHEDULED", "ENQUEUED")) > 0, 90,
    )  # fmt: skip
    before = _burst_states(cluster, label)
    wall, began = datetime.now(UTC), time.monotonic()
    what = fault()

    # then: every occurrence of the burst succeeds on the new leader
    done = _wait_states(cluster, stack, label, lambda s: s.get("SUCCEEDED") == BURST, 180)
    # the first commit of the burst on the new leader, counted from the fault
    promoted = cluster.promoted_at()
    first = (_first_commit_after(cluster, label, promoted) - wall).total_seconds()
    # nothing lost, and an effect repeats only where its occurrence was redelivered
    effects = _effects(cluster, label)
    assert len(effects) == BURST
    assert all(1 <= delivered <= attempts for delivered, attempts in effects), effects
    repeated = sum(1 for delivered, _ in effects if delivered > 1)
    # reconcile agrees (exit status 0: nothing missing, stuck or doubled)
    report = _manage(
        env, "reconcile", "--from", (instant - timedelta(minutes=1)).isoformat(),
        "--to", (instant + timedelta(minutes=1)).isoformat(),
    )  # fmt: skip
    assert "OK" in report, report
    # and every process rode it out: a burst created now runs as well
    stack.assert_alive()
    after = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=8)
    _create_burst(env, after, 30, f"{label}-after")
    _wait_states(cluster, stack, f"{label}-after", lambda s: s.get("SUCCEEDED") == 30, 90)
    stack.assert_alive()
    return (
        f"{what}: burst states at the fault {before}; new leader's timeline began "
        f"{(promoted - wall).total_seconds():.1f} s after it, its first commit of the burst "
        f"{first:.1f} s after it, last SUCCEEDED {done - began:.1f} s after it; "
        f"{repeated} effect(s) redelivered by id"
    )


def test_the_leader_killed_mid_burst_fails_over_and_loses_nothing(
    migrated: Any, queue_prefix: str, tmp_path: Path, settings: Any
) -> None:
    cluster = migrated
    stack, env = _start_stack(cluster, queue_prefix, tmp_path, settings.CELERY_BROKER_URL)
    timeline = cluster.timeline()
    try:
        old_name: list[str] = []

        def kill() -> str:
            old = cluster.kill_leader_postmaster()
            old_name.append(old.name)
            cluster.wait_for(lambda: cluster.leader() not in (None, old), 60, "a new leader")
            return f"leader {old.name} SIGKILLed, {cluster.leader().name} promoted"

        summary = _ride_out(cluster, stack, env, "failover", kill)
        assert cluster.timeline() > timeline
        # the old leader rejoins as the synchronous standby on the new timeline, rewound
        # when its WAL had diverged, with no one's help
        rejoined = cluster.wait_for(cluster.replicating, 120, "the old leader back as standby")
        roles = {m["name"]: (m["role"], m.get("timeline")) for m in cluster.members()}
        assert roles[old_name[0]] == ("sync_standby", cluster.timeline()), roles
        rewound = "pg_rewind" in (cluster.base / f"{old_name[0]}.log").read_text()
        sys.stdout.write(
            f"{summary}; the old leader streaming again {rejoined:.1f} s later "
            f"({'after pg_rewind' if rewound else 'no rewind needed'})\n"
        )
    finally:
        stack.stop_all()


def test_a_switchover_mid_burst_loses_nothing(
    migrated: Any, queue_prefix: str, tmp_path: Path, settings: Any
) -> None:
    cluster = migrated
    cluster.wait_for(cluster.replicating, 120, "a replicating cluster")
    stack, env = _start_stack(cluster, queue_prefix, tmp_path, settings.CELERY_BROKER_URL)
    try:

        def switchover() -> str:
            old, new = cluster.switchover()
            cluster.wait_for(lambda: cluster.leader() is cluster.node(new), 60, "the new leader")
            return f"switchover {old} → {new}"

        summary = _ride_out(cluster, stack, env, "switchover", switchover)
        rejoined = cluster.wait_for(cluster.replicating, 120, "the old leader back as standby")
        sys.stdout.write(f"{summary}; replicating again {rejoined:.1f} s later\n")
    finally:
        stack.stop_all()
