"""A private PostgreSQL cluster for fault tests: its own data directory, port and socket,
so restarting it never touches the machine's shared server.

Uses the PostgreSQL binaries already on the machine (the ones `make services` starts or
installs). As root the cluster runs as the `postgres` system user, like any packaged server.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from apps.occurrences.tests.support.processes import free_port


def _bin_dir() -> Path:
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(os.path.join(candidate, "initdb")):
            return Path(candidate)
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise RuntimeError("no PostgreSQL server binaries (initdb) on this machine")


class PrivatePostgres:
    def __init__(self, database: str = "tick_fault") -> None:
        self.bin = _bin_dir()
        # Outside root's home and pytest's 0700 temp dirs: the server user must reach it.
        self.base = Path(tempfile.mkdtemp(prefix="tick-pg-", dir="/tmp"))
        self.data = self.base / "data"
        self.port = free_port()
        self.database = database
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.base, "postgres", "postgres")

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.database}"

    def _run(self, *argv: str) -> None:
        subprocess.run([*self.as_user, *argv], check=True, capture_output=True, cwd="/tmp")

    def init(self) -> None:
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                  "--auth=trust", "--no-sync", "-E", "UTF8")  # fmt: skip
        self.start()
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')

    def dsn(self, database: str | None = None) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={database or self.database}"

    def start(self) -> None:
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 "
                   f"-c unix_socket_directories={self.base} -c max_connections=200")  # fmt: skip
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options,
                  "-l", str(self.base / "server.log"), "-w", "start")  # fmt: skip

    def stop(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def restart(self, down_s: float) -> float:
        """Stop (fast: every open connection is terminated), stay down `down_s`, start.
        Returns how long the server refused connections."""
        started = time.monotonic()
        self.stop()
        time.sleep(down_s)
        self.start()
        return time.monotonic() - started

    def destroy(self) -> None:
        try:
            self.stop()
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.base, ignore_errors=True)

    def server_log(self) -> str:
        path = self.base / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""
