"""Tick's long-running processes as real subprocesses, for end-to-end and fault tests.

Each process writes its own log file under the test's tmp_path; `stop_all` sends SIGTERM,
waits, kills what did not stop and prints each log's tail so a failing test shows why.
`ROOT` is the project directory the processes run in (where manage.py is).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.db import connection

ROOT: Path = settings.BASE_DIR


def free_port() -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def database_url(settings_dict: dict[str, Any]) -> str:
    """A postgres:// URL for Django's connection settings (e.g. the test database)."""
    s = settings_dict
    auth = quote(s["USER"] or "", safe="")
    if s["PASSWORD"]:
        auth += ":" + quote(s["PASSWORD"], safe="")
    host = quote(s["HOST"] or "", safe="")
    port = f":{s['PORT']}" if s["PORT"] else ""
    return f"postgres://{auth}@{host}{port}/{s['NAME']}"


def stack_env(
    *, database_url: str, broker_url: str, queue_prefix: str, **extra: str
) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url,
        "CELERY_BROKER_URL": broker_url,
        "TICK_QUEUE_PREFIX": queue_prefix,
        "DJANGO_DEBUG": "1",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def shared_stack_env(queue_prefix: str, **extra: str) -> dict[str, str]:
    """`stack_env` for processes on the test database and the machine's RabbitMQ."""
    return stack_env(
        database_url=database_url(connection.settings_dict),
        broker_url=settings.CELERY_BROKER_URL,
        queue_prefix=queue_prefix,
        **extra,
    )


def role_argv(role: str, *, name: str = "", concurrency: int = 2, **opts: Any) -> list[str]:
    """The command line of one process kind, as the Procfile runs it (faster idle sleeps)."""
    python = sys.executable
    if role == "worker":
        return [
            python, "-m", "celery", "-A", "tickweb", "worker", "--concurrency", str(concurrency),
            "--loglevel", "INFO", "--hostname", f"{name or 'worker'}-{os.getpid()}@%h",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
    defaults = {
        "materialize": ["--idle-sleep", "0.2"],
        "relay": ["--idle-sleep", "0.05"],
        "reap": ["--interval", "1"],
    }
    argv = [python, "manage.py", role, *defaults[role]]
    for key, value in opts.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv


class ProcessStack:
    def __init__(self, tmp_path: Path, env: dict[str, str]) -> None:
        self.tmp_path = tmp_path
        self.env = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with open(self.tmp_path / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=log, stderr=log)
        self.procs[name] = proc
        return proc

    def start_role(self, role: str, name: str = "", **opts: Any) -> subprocess.Popen[bytes]:
        name = name or role
        return self.start(name, role_argv(role, name=name, **opts))

    def dead(self) -> dict[str, int]:
        return {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}

    def assert_alive(self) -> None:
        dead = self.dead()
        assert not dead, f"exited: {dead}\n" + "\n".join(self.log_tail(n) for n in dead)

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.tmp_path / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return f"--- {name} log (tail) ---\n{text[-chars:]}"

    def log_text(self, name: str) -> str:
        path = self.tmp_path / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop_all(self, timeout_s: float = 20) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            sys.stdout.write(self.log_tail(name) + "\n")
