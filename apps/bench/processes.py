"""The real processes a benchmark runs, on a private queue prefix, and what they cost.

`BenchProcesses` starts Tick's processes as the Procfile does (`manage.py materialize`,
`relay`, `reap`; `celery -A tickweb worker`), each with its log file, and stops them by pid:
SIGTERM for the loops, SIGQUIT (cold shutdown) for workers, whose warm shutdown would wait
for every running handler; whatever still runs after the grace is killed, pool processes
included. CPU seconds and peak RSS are read from /proc per process kind; a worker's pool
processes are their own kind (`worker_pool`), since they, not the worker, run the handlers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, connection

from apps.occurrences.pipeline.broker import Publisher

ROOT = Path(__file__).resolve().parents[2]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
WORKER_KIND = "worker"
WORKER_POOL_KIND = "worker_pool"
# Celery logs "<hostname> ready." once a worker consumes.
WORKER_READY_MARK = b" ready."
# application_name of the bench processes' database connections: this prefix + their kind.
BACKEND_APP_PREFIX = "tick-bench-"
# backend_cpu's kind for the benchmark's own connection (its samples and readings).
OWN_BACKEND_KIND = "bench"
STOP_GRACE_S = 20.0


def _stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name (which may hold spaces); [] once gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def proc_cpu_s(pid: int, *, reaped_children: bool = False) -> float:
    """utime + stime of a live process; with `reaped_children`, also its waited-for children's
    (a worker's pool processes that were replaced during the run)."""
    fields = _stat_fields(pid)
    if not fields:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])  # cutime + cstime
    return ticks / CLOCK_TICKS


def proc_peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _live_pids() -> Iterable[Path]:
    return (entry for entry in Path("/proc").iterdir() if entry.name.isdigit())


def pids_named(*names: str) -> list[int]:
    pids = []
    for entry in _live_pids():
        try:
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if comm in names:
            pids.append(int(entry.name))
    return pids


def child_pids(parent: int) -> list[int]:
    """The live children of `parent` (a worker's pool processes)."""
    children = []
    for entry in _live_pids():
        fields = _stat_fields(int(entry.name))
        if fields and int(fields[1]) == parent:  # field 4 of stat: ppid
            children.append(int(entry.name))
    return children


def tree_cpu_s(root: int) -> float:
    """CPU seconds of a whole process tree: every live process under `root` (itself included)
    plus everything its processes have reaped. A child that exits moves its time into its
    parent's cutime/cstime, so the sum only grows, whatever exits between two readings (a
    PostgreSQL backend per connection, a worker's replaced pool process)."""
    parents: dict[int, list[int]] = {}
    for entry in _live_pids():
        fields = _stat_fields(int(entry.name))
        if fields:
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += proc_cpu_s(pid, reaped_children=True)
        stack.extend(parents.get(pid, ()))
    return total


def service_roots(*names: str) -> list[int]:
    """The processes named `names` whose parent is not one of them: a PostgreSQL postmaster,
    a RabbitMQ VM."""
    named = set(pids_named(*names))
    roots = []
    for pid in named:
        fields = _stat_fields(pid)
        if fields and int(fields[1]) not in named:
            roots.append(pid)
    return roots


def database_server_pid() -> int | None:
    """The postmaster of the server Django's database runs on, if it runs on this machine and
    its data directory is readable here (else None)."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SHOW data_directory")
            row = cursor.fetchone()
        pid = int((Path(row[0]) / "postmaster.pid").read_text().split()[0]) if row else 0
    except (OSError, ValueError, IndexError, DatabaseError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


def postgresql_cpu_s() -> float:
    """CPU seconds of the PostgreSQL server of Django's database (its whole tree: backends,
    walwriter, checkpointer, autovacuum), so another cluster on the machine is not counted;
    when that server is not found, of every PostgreSQL server here."""
    pid = database_server_pid()
    if pid is not None:
        return tree_cpu_s(pid)
    return sum(tree_cpu_s(p) for p in service_roots("postgres", "postmaster"))


def backend_cpu() -> dict[int, tuple[str, float]]:
    """Per backend pid: the kind of bench process it serves (its `application_name`,
    BenchProcesses._start), or OWN_BACKEND_KIND for the backend of the caller's own
    connection, and its CPU seconds so far. Take the difference of two readings per pid
    (`backend_cpu_diff`); merge readings taken every few seconds (`backend_cpu_seen`) so
    that connections replaced during a run still count."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, CASE WHEN pid = pg_backend_pid() THEN %s "
            "ELSE substr(application_name, %s) END FROM pg_stat_activity "
            "WHERE application_name LIKE %s OR pid = pg_backend_pid()",
            [OWN_BACKEND_KIND, len(BACKEND_APP_PREFIX) + 1, f"{BACKEND_APP_PREFIX}%"],
        )
        rows = cursor.fetchall()
    return {int(pid): (str(kind), proc_cpu_s(int(pid))) for pid, kind in rows}


def backend_cpu_seen(
    seen: dict[int, tuple[str, float]], reading: dict[int, tuple[str, float]]
) -> dict[int, tuple[str, float]]:
    """`seen` brought up to date by a newer `backend_cpu` reading: a backend gone since keeps
    its last reading. A worker's connection is replaced every CONN_MAX_AGE, so over a run
    most of the workers' backends end before the last reading; sampled every few seconds,
    each counts up to its last sample instead of not at all."""
    return {**seen, **reading}


def backend_cpu_diff(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds per kind between two `backend_cpu` readings (or `backend_cpu_seen`
    merges); a backend missing from `after` is lost, one that started counts from its
    start."""
    cpu: dict[str, float] = {}
    for pid, (kind, seconds) in after.items():
        earlier = before.get(pid, (kind, 0.0))[1]
        cpu[kind] = round(cpu.get(kind, 0.0) + max(0.0, seconds - earlier), 3)
    return cpu


def services_cpu() -> dict[str, float]:
    """CPU seconds PostgreSQL and RabbitMQ have used so far (take the difference): each
    service's whole process tree, so backends that exit during a run still count
    (docs/performance.md "How CPU is measured")."""
    return {
        "postgresql": postgresql_cpu_s(),
        "rabbitmq": sum(tree_cpu_s(p) for p in service_roots("beam.smp")),
    }


def _publisher(broker_url: str, prefix: str) -> Publisher:
    return Publisher(
        broker_url, prefix=prefix, partitions=settings.TICK_TENANT_PARTITIONS, celery_app=None
    )


def declare_topology(broker_url: str, prefix: str) -> None:
    declarer = _publisher(broker_url, prefix)
    declarer.connect()  # declares the topology the relay will publish to
    declarer.close()


def delete_topology(broker_url: str, prefix: str) -> None:
    cleaner = _publisher(broker_url, prefix)
    cleaner.delete_topology()
    cleaner.close()


def worker_argv(hostname: str, concurrency: int, *, app: str = "tickweb") -> list[str]:
    """A Celery worker as the Procfile runs it, without gossip, mingle and heartbeats, which
    would talk to every other worker on the broker."""
    return [
        sys.executable, "-m", "celery", "-A", app, "worker", "--loglevel", "INFO",
        "--concurrency", str(concurrency), "--hostname", f"{hostname}@%h",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip


class BenchProcesses:
    """The processes of one run, keyed by name (`materialize`, `worker-1`, …)."""

    def __init__(self, prefix: str, logs: Path) -> None:
        self.prefix = prefix
        self.logs = logs
        self.env = {**os.environ, "TICK_QUEUE_PREFIX": prefix, "PYTHONUNBUFFERED": "1"}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.kinds: dict[str, str] = {}

    def _start(self, name: str, kind: str, argv: list[str]) -> None:
        # Registered as soon as it runs, so that `stop` ends it even if the next start fails.
        # libpq names its connections after the kind, so the server's backends can be
        # counted per kind (`backend_cpu_by_kind`).
        env = {**self.env, "PGAPPNAME": f"{BACKEND_APP_PREFIX}{kind}"}
        self.procs[name] = subprocess.Popen(  # noqa: S603 - fixed argv: this interpreter
            argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
            stderr=(self.logs / f"{name}.log").open("wb"),
        )  # fmt: skip
        self.kinds[name] = kind

    def start_command(self, command: str, count: int = 1) -> None:
        """`count` processes of `manage.py <command>` with its Procfile defaults, named
        `command` (one) or `command-1` … (several, sharing the shard leases); their kind is the
        command name."""
        for n in range(1, count + 1):
            name = command if count == 1 else f"{command}-{n}"
            self._start(name, command, [sys.executable, "manage.py", command])

    def start_workers(
        self, workers: int, concurrency: int, *, app: str = "tickweb", queues: str | None = None
    ) -> None:
        """W Celery workers of C slots; `app` and `queues` for a worker of another app (the
        bare-Celery floor, bench/bare_celery.py)."""
        for n in range(1, workers + 1):
            name = f"{WORKER_KIND}-{n}"
            argv = worker_argv(f"{self.prefix}-{name}", concurrency, app=app)
            self._start(name, WORKER_KIND, argv + (["--queues", queues] if queues else []))

    def _worker_names(self) -> list[str]:
        return [name for name, kind in self.kinds.items() if kind == WORKER_KIND]

    def workers_ready(self) -> bool:
        return all(
            WORKER_READY_MARK in (self.logs / f"{name}.log").read_bytes()
            for name in self._worker_names()
        )

    def wait_workers_ready(self, timeout_s: float) -> float | None:
        """Seconds until every worker consumes, or None if not within `timeout_s`."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if self.workers_ready():
                return time.monotonic() - started
            time.sleep(0.25)
        return None

    def signal_kind(self, kind: str, signum: int) -> int:
        """Send `signum` to every running process of `kind` (SIGSTOP/SIGCONT: a stall);
        returns how many got it."""
        sent = 0
        for name, proc in self.procs.items():
            if self.kinds[name] == kind and proc.poll() is None:
                proc.send_signal(signum)
                sent += 1
        return sent

    def exited(self) -> dict[str, int]:
        return {n: code for n, p in self.procs.items() if (code := p.poll()) is not None}

    def usage(
        self, services_before: dict[str, float], *, own_kind: str
    ) -> tuple[dict[str, float], dict[str, float]]:
        """CPU seconds (summed) and peak RSS in MiB (the largest process) per kind, the
        services' CPU since `services_before`, and this process's under `own_kind`."""
        cpu: dict[str, float] = {}
        rss: dict[str, float] = {}

        def add(kind: str, cpu_s: float, rss_mb: float) -> None:
            cpu[kind] = cpu.get(kind, 0.0) + cpu_s
            rss[kind] = max(rss.get(kind, 0.0), rss_mb)

        for name, proc in self.procs.items():
            kind = self.kinds[name]
            add(kind, proc_cpu_s(proc.pid), proc_peak_rss_mb(proc.pid))
            if kind == WORKER_KIND:
                replaced = proc_cpu_s(proc.pid, reaped_children=True) - proc_cpu_s(proc.pid)
                add(WORKER_POOL_KIND, replaced, 0.0)
                for child in child_pids(proc.pid):
                    add(WORKER_POOL_KIND, proc_cpu_s(child), proc_peak_rss_mb(child))
        for name, after in services_cpu().items():
            cpu[name] = after - services_before.get(name, 0.0)
        add(own_kind, proc_cpu_s(os.getpid()), proc_peak_rss_mb(os.getpid()))
        return cpu, rss

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the loops, SIGQUIT the workers; kill what is left after `grace_s`, the
        workers' pool processes included (by the pids they had before the stop)."""
        pool = [c for n in self._worker_names() for c in child_pids(self.procs[n].pid)]
        for name, proc in self.procs.items():
            if proc.poll() is None:
                is_worker = self.kinds[name] == WORKER_KIND
                proc.send_signal(signal.SIGQUIT if is_worker else signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in pool:
            if _is_worker_process(pid):  # still there: an orphaned pool process
                os.kill(pid, signal.SIGKILL)


def _is_worker_process(pid: int) -> bool:
    """Whether `pid` is (still) a Celery process of this project, not a reused pid."""
    try:
        return b"tickweb" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
