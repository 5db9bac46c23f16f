"""A private high-availability PostgreSQL for failover tests and trials (docs/operations.md
"PostgreSQL under Patroni"): a one-node etcd, two PostgreSQL 15 nodes under Patroni with
synchronous replication, and HAProxy sending connections to whichever node Patroni's REST
API calls the primary. Own ports and data directories under /tmp; the machine's PostgreSQL
is never touched.

    python scripts/patroni_cluster.py          # `make patroni`: up until Ctrl-C, prints the URL

Debian's packages are the parts (`patroni` 3.0, `etcd-server` 3.4, `haproxy` 2.6);
`make patroni` installs the missing ones. Tests import `PatroniCluster` from this file.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

TOOLS = ("/usr/bin/patroni", "/usr/bin/patronictl", "/usr/bin/etcd", "/usr/sbin/haproxy")


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if not os.path.exists(tool)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pg_bin_dir() -> str:
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(os.path.join(candidate, "initdb")):
            return candidate
    raise RuntimeError("no PostgreSQL server binaries on this machine")


class Node:
    def __init__(self, name: str, base: Path) -> None:
        self.name = name
        self.pg_port = _free_port()
        self.rest_port = _free_port()
        self.data = base / name
        self.config = base / f"{name}.yml"
        self.log = base / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def rest(self, path: str, timeout: float = 1.0) -> tuple[int, Any]:
        """Status and body of a GET on this node's Patroni REST API ((0, {}) when down)."""
        try:
            with urllib.request.urlopen(  # noqa: S310 - our own http://127.0.0.1 address
                f"http://127.0.0.1:{self.rest_port}{path}", timeout=timeout
            ) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as error:
            body = error.read()
            return error.code, json.loads(body) if body else {}
        except (OSError, ValueError):
            return 0, {}

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])


class PatroniCluster:
    """etcd + two Patroni nodes + HAProxy. `url` is the database URL clients use (HAProxy)."""

    def __init__(self, database: str = "tick", scope: str = "") -> None:
        # Outside root's home and pytest's 0700 temp dirs: the `postgres` user must reach it.
        self.base = Path(tempfile.mkdtemp(prefix="tick-patroni-", dir="/tmp"))  # noqa: S108
        self.database = database
        self.scope = scope or f"tick-{os.getpid()}"
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.etcd_port = _free_port()
        self.etcd_peer_port = _free_port()
        self.haproxy_port = _free_port()
        self.nodes = [Node("node1", self.base), Node("node2", self.base)]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.etcd: subprocess.Popen[bytes] | None = None
        self.haproxy: subprocess.Popen[bytes] | None = None
        self.bin_dir = _pg_bin_dir()

    # ---- addresses ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.haproxy_port}/{self.database}"

    def dsn(self, database: str | None = None) -> str:
        return (
            f"host=127.0.0.1 port={self.haproxy_port} user=postgres "
            f"dbname={database or self.database}"
        )

    # ---- start and stop ----------------------------------------------------------------

    def _spawn(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            proc = subprocess.Popen(  # noqa: S603 - fixed tools, our own arguments
                [*self.as_user, *argv], stdout=out, stderr=out, cwd=self.base
            )
        self.procs.append(proc)
        return proc

    def start(self, timeout_s: float = 90) -> None:
        if self.as_user:
            shutil.chown(self.base, "postgres", "postgres")
        self._start_etcd()
        for node in self.nodes:
            self._write_node_config(node)
        self.start_node(self.nodes[0])
        self.wait_for(lambda: self.leader() is not None, timeout_s, "a leader")
        self.start_node(self.nodes[1])
        self.wait_for(self.replicating, timeout_s, "a synchronous standby")
        self._start_haproxy()
        self.wait_for(self._haproxy_answers, timeout_s, "HAProxy to reach the leader")
        self._create_database()

    def _start_etcd(self) -> None:
        data = self.base / "etcd"
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        self.etcd = self._spawn(
            ["/usr/bin/etcd", "--name", "etcd1", "--data-dir", str(data),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"etcd1={peer}", "--initial-cluster-state", "new",
             "--enable-v2=true"],
            self.base / "etcd.log",
        )  # fmt: skip
        self.wait_for(lambda: _port_open(self.etcd_port), 30, "etcd")

    def _write_node_config(self, node: Node) -> None:
        # JSON is YAML: no YAML library needed to write Patroni's configuration.
        config = {
            "scope": self.scope,
            "namespace": "/tick/",
            "name": node.name,
            "restapi": {
                "listen": f"127.0.0.1:{node.rest_port}",
                "connect_address": f"127.0.0.1:{node.rest_port}",
            },
            "etcd3": {"host": f"127.0.0.1:{self.etcd_port}"},
            "bootstrap": {
                "dcs": {
                    # A lost leader is noticed within about ttl; loop_wait is Patroni's beat.
                    "ttl": 10,
                    "loop_wait": 1,
                    "retry_timeout": 4,
                    # The synchronous standby has every commit; what it lags by is WAL
                    # of transactions not yet committed. Patroni's default (1 MB) would
                    # refuse to fail over in the middle of a burst and restart in place.
                    "maximum_lag_on_failover": 1024**3,
                    # Commits wait for the standby: a failover loses no committed row.
                    "synchronous_mode": True,
                    # A crashed primary is failed over at once instead of restarted in place
                    # (safe with a synchronous standby, which has every commit).
                    "primary_start_timeout": 0,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "wal_level": "replica",
                            "hot_standby": "on",
                            "wal_log_hints": "on",
                            "max_connections": 200,
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "wal_keep_size": "256MB",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{node.pg_port}",
                "connect_address": f"127.0.0.1:{node.pg_port}",
                "data_dir": str(node.data),
                "bin_dir": self.bin_dir,
                "pgpass": str(self.base / f"{node.name}.pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": "postgres"},
                    "replication": {"username": "postgres", "password": "postgres"},
                    "rewind": {"username": "postgres", "password": "postgres"},
                },
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
                "parameters": {"unix_socket_directories": str(self.base)},
                # The old primary rejoins after a failover by pg_rewind, without anyone.
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
            },
        }
        node.config.write_text(json.dumps(config, indent=2))
        if self.as_user:
            shutil.chown(node.config, "postgres", "postgres")

    def start_node(self, node: Node) -> None:
        node.process = self._spawn(["/usr/bin/patroni", str(node.config)], node.log)

    def _start_haproxy(self) -> None:
        servers = "\n".join(
            f"    server {n.name} 127.0.0.1:{n.pg_port} check port {n.rest_port}"
            for n in self.nodes
        )
        # Routes to the node whose REST API answers 200 on /primary; a node marked down
        # has its client connections cut, so none lingers on a demoted primary.
        cfg = self.base / "haproxy.cfg"
        cfg.write_text(
            f"""global
    maxconn 1000
defaults
    mode tcp
    timeout connect 2s
    timeout client 30m
    timeout server 30m
    timeout check 1s
listen primary
    bind 127.0.0.1:{self.haproxy_port}
    balance first
    option httpchk GET /primary
    http-check expect status 200
    default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions
{servers}
"""
        )
        self.haproxy = self._spawn(
            ["/usr/sbin/haproxy", "-db", "-f", str(cfg)], self.base / "haproxy.log"
        )

    def _haproxy_answers(self) -> bool:
        """HAProxy takes every server for up until its checks say otherwise: wait until
        a second's worth of connections in a row all reach the primary."""
        import psycopg

        for _ in range(6):
            try:
                with psycopg.connect(self.dsn("postgres"), connect_timeout=2) as conn:
                    if conn.execute("SELECT pg_is_in_recovery()").fetchone() != (False,):
                        return False
            except psycopg.Error:
                return False
            time.sleep(0.2)
        return True

    def _create_database(self) -> None:
        import psycopg

        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [self.database]
            ).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{self.database}"')

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # Patroni stops its PostgreSQL; one that outlived it (a killed Patroni) is stopped here.
        for node in self.nodes:
            if (node.data / "postmaster.pid").exists():
                subprocess.run(  # noqa: S603 - a fixed tool
                    [*self.as_user, f"{self.bin_dir}/pg_ctl", "-D", str(node.data),
                     "-m", "immediate", "stop"],
                    capture_output=True, check=False, cwd=self.base,
                )  # fmt: skip

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    # ---- state -------------------------------------------------------------------------

    def members(self) -> list[dict[str, Any]]:
        for node in self.nodes:
            status, body = node.rest("/cluster")
            if status == 200:
                return list(body.get("members", []))
        return []

    def leader(self) -> Node | None:
        for member in self.members():
            if member.get("role") == "leader" and member.get("state") == "running":
                return self.node(member["name"])
        return None

    def replica(self) -> Node | None:
        leader = self.leader()
        return next((n for n in self.nodes if n is not leader), None)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def replicating(self) -> bool:
        """A leader and a synchronous standby that streams from it."""
        roles = {m.get("role"): m for m in self.members()}
        sync = roles.get("sync_standby")
        return (
            "leader" in roles
            and sync is not None
            and sync.get("state")
            in (
                "running",
                "streaming",
            )
        )

    def timeline(self) -> int:
        leader = self.leader()
        if leader is None:
            return 0
        return int(leader.rest("/patroni")[1].get("timeline", 0))

    def promoted_at(self) -> datetime:
        """When the current leader's timeline began (Patroni's /history: its promotion)."""
        leader = self.leader()
        if leader is None:
            raise RuntimeError("no leader")
        status, history = leader.rest("/history")
        if status != 200 or not history:
            raise RuntimeError(f"no timeline history from {leader.name} ({status})")
        return datetime.fromisoformat(list(history)[-1][3])

    def wait_for(self, check: Any, timeout_s: float, what: str) -> float:
        began = time.monotonic()
        while time.monotonic() - began < timeout_s:
            if check():
                return time.monotonic() - began
            time.sleep(0.2)
        raise RuntimeError(f"no {what} after {timeout_s:.0f} s\n{self.logs_tail()}")

    def logs_tail(self, chars: int = 2500) -> str:
        parts = []
        for log in sorted(self.base.glob("*.log")):
            parts.append(f"--- {log.name} ---\n{log.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    # ---- faults and operations ---------------------------------------------------------

    def kill_leader_postmaster(self) -> Node:
        """SIGKILL the leader's postmaster (its backends die with it); Patroni stays up."""
        leader = self.leader()
        if leader is None:
            raise RuntimeError("no leader to kill")
        os.kill(leader.postmaster_pid(), signal.SIGKILL)
        return leader

    def switchover(self) -> tuple[str, str]:
        """A planned `patronictl switchover` to the synchronous standby; (from, to)."""
        leader, candidate = self.leader(), self.replica()
        if leader is None or candidate is None:
            raise RuntimeError("switchover needs a leader and a replica")
        done = subprocess.run(  # noqa: S603 - a fixed tool
            ["/usr/bin/patronictl", "-c", str(leader.config), "switchover", self.scope,
             "--leader", leader.name, "--candidate", candidate.name, "--force"],
            capture_output=True, text=True, check=False, cwd=self.base,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"patronictl switchover failed: {done.stdout}{done.stderr}")
        return leader.name, candidate.name


def _port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.3).close()
        return True
    except OSError:
        return False


def main() -> None:
    missing = missing_tools()
    if missing:
        sys.exit(f"missing {', '.join(missing)}: `make patroni` installs the packages")
    cluster = PatroniCluster()
    try:
        began = time.monotonic()
        cluster.start()
        print(f"up in {time.monotonic() - began:.1f} s: DATABASE_URL={cluster.url}")
        leader = cluster.leader()
        print(f"leader {leader.name if leader else '?'}; files in {cluster.base}")
        print("Ctrl-C stops it and removes the files.")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.destroy()


if __name__ == "__main__":
    main()
