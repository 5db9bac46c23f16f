"""PostgreSQL connections of the whole stack under `bench_api` load, directly and through
PgBouncer in transaction mode (docs/performance.md "Connections with and without PgBouncer").

    python scripts/connection_counts.py [--pool-size 8] [--worker-concurrency 8] [--seconds 20]

Starts materialize, relay, reap and a Celery worker (as the Procfile runs them, on a private
queue prefix), then `manage.py bench_api` (its own gunicorn, the web role) with 32 clients
reading and listing; meanwhile counts the database's server connections in
`pg_stat_activity` every 0.25 s. Once with every process connected directly, once with the
web and the engine through a private PgBouncer (`tickweb/pgbouncer.py`). Uses DATABASE_URL
and TICK_WEB_DATABASE_URL from the environment (`.run/services.env`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tickweb.pgbouncer import PrivatePgBouncer  # noqa: E402 - after the path set-up

PYTHON = sys.executable


def _via(url: str, port: int) -> str:
    parts = urlsplit(url)
    login = parts.netloc.rsplit("@", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{login}@127.0.0.1:{port}"))


def _sampler(dsn: str, database: str, stop: threading.Event, counts: list[int]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                "AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
                [database],
            ).fetchone()
            counts.append(int(row[0]) if row else 0)
            time.sleep(0.25)


def _engine(env: dict[str, str], logs: Path, concurrency: int) -> list[subprocess.Popen[bytes]]:
    argvs = {
        "materialize": [PYTHON, "manage.py", "materialize", "--idle-sleep", "0.2"],
        "relay": [PYTHON, "manage.py", "relay", "--idle-sleep", "0.05"],
        "reap": [PYTHON, "manage.py", "reap", "--interval", "1"],
        "worker": [PYTHON, "-m", "celery", "-A", "tickweb", "worker", "--concurrency",
                   str(concurrency), "--loglevel", "WARNING", "--hostname",
                   f"conncount-{os.getpid()}@%h", "--without-gossip", "--without-mingle",
                   "--without-heartbeat"],
    }  # fmt: skip
    procs = []
    for name, argv in argvs.items():
        with open(logs / f"{name}.log", "ab") as log:
            procs.append(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=log))
    return procs


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def measure(mode: str, args: argparse.Namespace, logs: Path) -> dict[str, object]:
    owner_url = os.environ["DATABASE_URL"]
    web_url = os.environ.get("TICK_WEB_DATABASE_URL", owner_url)
    database = urlsplit(owner_url).path.lstrip("/")
    env = {**os.environ, "TICK_QUEUE_PREFIX": f"tick-conn-{uuid.uuid4().hex[:8]}",
           "PYTHONUNBUFFERED": "1"}  # fmt: skip
    bouncer = None
    engine_env = dict(env)
    bench_env = {**env, "TICK_BENCH": "1"}  # bench_api is in apps/bench/, even with DEBUG off
    if mode == "pgbouncer":
        bouncer = PrivatePgBouncer(owner_url, pool_size=args.pool_size, users=("tick_web",))
        bouncer.start()
        engine_env.update(DATABASE_URL=_via(owner_url, bouncer.port), DATABASE_POOLER="transaction")
        bench_env.update(
            TICK_WEB_DATABASE_URL=_via(web_url, bouncer.port), DATABASE_POOLER="transaction"
        )
    counts: list[int] = []
    stop = threading.Event()
    procs = _engine(engine_env, logs, args.worker_concurrency)
    try:
        time.sleep(8)  # the engine connected and idle-looping
        idle_counts: list[int] = []
        idle_stop = threading.Event()
        idle = threading.Thread(target=_sampler, args=(owner_url, database, idle_stop, idle_counts))
        idle.start()
        time.sleep(3)
        idle_stop.set()
        idle.join()
        sampler = threading.Thread(target=_sampler, args=(owner_url, database, stop, counts))
        sampler.start()
        done = subprocess.run(
            [PYTHON, "manage.py", "bench_api", "--json", "--clients", "32", "--seconds",
             str(args.seconds), "--endpoints", "read,list", "--schedules", "1000"],
            cwd=ROOT, env=bench_env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        stop.set()
        sampler.join()
        if done.returncode != 0:
            raise RuntimeError(done.stdout[-3000:] + done.stderr[-3000:])
        report = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        stop.set()
        _stop(procs)
        if bouncer is not None:
            bouncer.stop()
    return {
        "mode": mode,
        "idle_engine_connections": max(idle_counts) if idle_counts else 0,
        "peak_connections": max(counts),
        "median_connections": statistics.median(counts),
        "api": {
            endpoint: {
                n: {k: run[k] for k in ("rps", "p50_ms", "p99_ms", "errors")}
                for n, run in runs.items()
            }
            for endpoint, runs in report["endpoints"].items()
        },  # fmt: skip
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool-size", type=int, default=8)
    parser.add_argument("--worker-concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--logs", type=Path, default=Path("/tmp/tick-connection-counts"))  # noqa: S108
    args = parser.parse_args()
    args.logs.mkdir(parents=True, exist_ok=True)
    for mode in ("direct", "pgbouncer"):
        print(json.dumps(measure(mode, args, args.logs), default=str))


if __name__ == "__main__":
    main()
