"""Private RabbitMQ nodes for fault tests: one node, or a 3-node cluster, on this machine.

The shared broker (`rabbit@localhost`, :5672) is never touched: each node here has its own
node name, AMQP and distribution ports, data/log directories, config file, empty plugin list
(no management listener on :15672) and Erlang cookie (in a private HOME), and is driven with
`rabbitmqctl -n <node>`. Nodes run as child processes in their own session, so teardown can
stop them by pid even when a test failed half way.

Measured on a 2-core machine (RabbitMQ 3.10, Erlang 25): one node boots in 5-6.5 s; three
nodes boot in parallel in ~16 s and joining two of them takes ~8 s more (21-26 s in all).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from apps.occurrences.tests.support.processes import free_port

# Debian's /usr/sbin wrappers re-run the tools as the `rabbitmq` user from /var/lib/rabbitmq
# (the shared node's home and cookie); the real scripts are here.
_DEBIAN_BIN = Path("/usr/lib/rabbitmq/bin")
BOOT_TIMEOUT_S = 90.0
CTL_TIMEOUT_S = 60.0


def rabbitmq_tool(name: str) -> str | None:
    """Path of a RabbitMQ script (rabbitmq-server, rabbitmqctl, ...), or None if absent."""
    candidate = _DEBIAN_BIN / name
    if candidate.exists():
        return str(candidate)
    return shutil.which(name)


def _port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
        return True
    return False


@dataclass
class RabbitNode:
    name: str  # e.g. tick-1a2b3c4d-1@localhost
    amqp_port: int
    dist_port: int
    base: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}//"

    @property
    def running(self) -> bool:
        """The Erlang VM is up (its RabbitMQ application may still be stopped)."""
        return self.process is not None and self.process.poll() is None

    @property
    def log_file(self) -> Path:
        return self.base / "log" / f"{self.name}.log"


class PrivateRabbitMQ:
    """`count` private nodes under `root`; `start()` boots them, `form_cluster()` joins them."""

    def __init__(self, root: Path, count: int = 1) -> None:
        server, ctl = rabbitmq_tool("rabbitmq-server"), rabbitmq_tool("rabbitmqctl")
        if server is None or ctl is None:
            raise RuntimeError("rabbitmq-server/rabbitmqctl not installed")
        self.server_bin, self.ctl_bin = server, ctl
        self.queues_bin = rabbitmq_tool("rabbitmq-queues")
        self.root = root
        tag = secrets.token_hex(4)
        # Own HOME: the nodes and our rabbitmqctl calls share a cookie nobody else has.
        self.home = root / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        cookie = self.home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16).upper())
        cookie.chmod(0o400)
        self.plugins_file = root / "enabled_plugins"
        self.plugins_file.write_text("[].\n")
        self.nodes = [
            RabbitNode(f"tick-{tag}-{i}@localhost", free_port(), free_port(), root / f"n{i}")
            for i in range(1, count + 1)
        ]
        self.stopped_apps: set[str] = set()

    # -- environment ---------------------------------------------------------------------
    @property
    def broker_url(self) -> str:
        """Every node, in Celery/kombu's failover syntax."""
        return ";".join(node.url for node in self.nodes)

    def _base_env(self) -> dict[str, str]:
        # Nothing of an operator's RabbitMQ/Erlang environment may leak into a private node.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env["HOME"] = str(self.home)
        return env

    def node_env(self, node: RabbitNode) -> dict[str, str]:
        node.base.mkdir(parents=True, exist_ok=True)
        config = node.base / "rabbitmq.conf"
        # The system config (/etc/rabbitmq) binds the shared node's :5672: never read it.
        config.write_text(f"listeners.tcp.1 = 127.0.0.1:{node.amqp_port}\n")
        conf_env = node.base / "rabbitmq-env.conf"
        conf_env.touch()
        return {
            **self._base_env(),
            "RABBITMQ_NODENAME": node.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(node.amqp_port),
            "RABBITMQ_DIST_PORT": str(node.dist_port),
            "RABBITMQ_MNESIA_BASE": str(node.base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(node.base / "log"),
            "RABBITMQ_PID_FILE": str(node.base / "pid"),
            "RABBITMQ_CONFIG_FILE": str(config),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(node.base / "advanced.config"),
            # /etc/rabbitmq/rabbitmq-env.conf names the shared node: read an empty one.
            "RABBITMQ_CONF_ENV_FILE": str(conf_env),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.plugins_file),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    # -- rabbitmqctl -----------------------------------------------------------------------
    def ctl(
        self, node: RabbitNode, *args: str, timeout_s: float = CTL_TIMEOUT_S, tool: str = ""
    ) -> str:
        """Run `rabbitmqctl -n NODE args...` (or another CLI tool); stdout, or raise."""
        argv = [tool or self.ctl_bin, "-n", node.name, *args]
        done = subprocess.run(  # noqa: S603 - fixed tools, our own arguments
            argv, env=self._base_env(), capture_output=True, timeout=timeout_s, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} exited {done.returncode}:\n"
                f"{done.stdout.decode(errors='replace')}\n{done.stderr.decode(errors='replace')}"
            )
        return done.stdout.decode(errors="replace")

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Boot every node (in parallel) and wait until each has finished starting."""
        for node in self.nodes:
            self.launch(node)
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(self.await_boot, self.nodes))

    def launch(self, node: RabbitNode) -> None:
        """Start the node's VM in its own session (detached from the test's terminal)."""
        env = self.node_env(node)
        with open(node.base / "server.out", "ab") as out:
            node.process = subprocess.Popen(  # noqa: S603 - a fixed tool
                [self.server_bin],
                env=env,
                cwd=node.base,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.stopped_apps.discard(node.name)

    def await_boot(self, node: RabbitNode, timeout_s: float = BOOT_TIMEOUT_S) -> None:
        """Wait for the AMQP listener (a cheap probe: each rabbitmqctl call costs ~0.5 s of
        CPU), then for `await_startup`, so the node is fully booted when this returns."""
        deadline = time.monotonic() + timeout_s
        while not _port_open(node.amqp_port):
            if not node.running:
                raise RuntimeError(f"{node.name} exited while booting\n{self.log_tail(node)}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{node.name} did not boot in {timeout_s}s\n{self.log_tail(node)}"
                )
            time.sleep(0.1)
        self.ctl(node, "await_startup", "--timeout", str(int(timeout_s)))

    def stop_app(self, node: RabbitNode) -> None:
        """Stop RabbitMQ on the node (clients are disconnected), keeping the VM running."""
        self.ctl(node, "stop_app")
        self.stopped_apps.add(node.name)

    def start_app(self, node: RabbitNode) -> None:
        self.ctl(node, "start_app")
        self.stopped_apps.discard(node.name)
        self.await_boot(node)

    def stop_node(self, node: RabbitNode, timeout_s: float = 30.0) -> None:
        """Shut the node down cleanly and wait for its VM to exit."""
        if not node.running:
            return
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self.ctl(node, "stop", timeout_s=timeout_s)
        self._reap(node, timeout_s)

    def kill_node(self, node: RabbitNode) -> None:
        """SIGKILL the node's VM and its helpers: a crash, no goodbye to clients or peers."""
        self._reap(node, 0)

    def _reap(self, node: RabbitNode, timeout_s: float) -> None:
        proc = node.process
        if proc is None:
            return
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        # The VM and its port helpers (erl_child_setup, inet_gethost) share its session.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def restart_node(self, node: RabbitNode) -> None:
        """Boot a node that was stopped or killed again, on the same data (it rejoins)."""
        self.launch(node)
        self.await_boot(node)

    def restore(self) -> None:
        """Bring every node back up (after a test stopped or killed some)."""
        for node in self.nodes:
            if not node.running:
                self.restart_node(node)
            elif node.name in self.stopped_apps:
                self.start_app(node)

    def close(self) -> None:
        """Stop every node (cleanly if it answers, else SIGKILL) and delete its files."""
        with ThreadPoolExecutor(max(len(self.nodes), 1)) as pool:
            list(pool.map(lambda n: self.stop_node(n, timeout_s=20.0), self.nodes))
        shutil.rmtree(self.root, ignore_errors=True)

    # -- clustering ------------------------------------------------------------------------
    def form_cluster(self) -> None:
        """Join nodes 2..n to node 1 (stop_app, join_cluster, start_app) and check it."""
        first, others = self.nodes[0], self.nodes[1:]
        for node in others:
            self.ctl(node, "stop_app")
            self.ctl(node, "join_cluster", first.name)
            self.ctl(node, "start_app")
        for node in others:
            self.await_boot(node)
        running = self.running_nodes(first)
        expected = {node.name for node in self.nodes}
        if set(running) != expected:
            raise RuntimeError(f"cluster formed with {sorted(running)}, expected {expected}")

    def running_nodes(self, via: RabbitNode) -> list[str]:
        status = json.loads(self.ctl(via, "cluster_status", "--formatter", "json"))
        return list(status.get("running_nodes", []))

    def answering_node(self) -> RabbitNode:
        for node in self.nodes:
            if node.running and node.name not in self.stopped_apps:
                return node
        raise RuntimeError("no node is running")

    def queue_leaders(self, vhost: str = "/") -> dict[str, str]:
        """Quorum queue name -> the node that leads it (asked of any node that answers)."""
        out = self.ctl(
            self.answering_node(),
            "list_queues", "-p", vhost, "name", "type", "leader", "--formatter", "json",
        )  # fmt: skip
        return {
            row["name"]: row["leader"] for row in json.loads(out) if row.get("type") == "quorum"
        }

    def leader_of(self, queue: str, vhost: str = "/") -> RabbitNode:
        leader = self.queue_leaders(vhost).get(queue)
        for node in self.nodes:
            if node.name == leader:
                return node
        raise LookupError(f"no leader known for quorum queue {queue!r} (got {leader!r})")

    def node_named(self, name: str) -> RabbitNode:
        return next(node for node in self.nodes if node.name == name)

    # -- diagnostics -----------------------------------------------------------------------
    def log_tail(self, node: RabbitNode, chars: int = 3000) -> str:
        parts = []
        for path in (node.base / "server.out", node.log_file):
            if path.exists():
                parts.append(f"--- {path.name} ---\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)
