"""PgBouncer in transaction mode in front of Tick's PostgreSQL (docs/operations.md
"PgBouncer"): its configuration rendered from a `DATABASE_URL`, and a private instance
(own port and directory) that the tests start and stop.

    python -m tickweb.pgbouncer --database-url "$DATABASE_URL" --port 6432 --dir .run/pgbouncer

writes `pgbouncer.ini` and `userlist.txt` there and runs PgBouncer in the foreground; point
the web's and workers' `DATABASE_URL` at `127.0.0.1:6432` and set `DATABASE_POOLER=transaction`
(tickweb/settings.py). Debian's package (`pgbouncer`, 1.18) is the binary; `make pgbouncer`
installs it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlsplit

BINARY = "/usr/sbin/pgbouncer"


def render(
    database_url: str,
    *,
    port: int,
    directory: Path,
    pool_size: int,
    max_client_conn: int = 1000,
) -> str:
    """pgbouncer.ini for one database, reached under the same name as in `database_url`.

    Passwords in the URL go to `userlist.txt` (written by `write`); without one the server
    must trust the pooler's address (as the local test server does)."""
    url = urlsplit(database_url)
    dbname = unquote(url.path.lstrip("/")) or "postgres"
    target = f"host={url.hostname or '127.0.0.1'} port={url.port or 5432} dbname={dbname}"
    lines = [
        "[databases]",
        # Any database name the client asks for (the tests' test_… database among them).
        f"* = host={url.hostname or '127.0.0.1'} port={url.port or 5432}",
        f"{dbname} = {target}",
        "",
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        f"listen_port = {port}",
        f"unix_socket_dir = {directory}",
        f"pidfile = {directory / 'pgbouncer.pid'}",
        f"logfile = {directory / 'pgbouncer.log'}",
        # Trust: the password (if any) is checked by PostgreSQL itself with the same one.
        "auth_type = trust",
        f"auth_file = {directory / 'userlist.txt'}",
        # A server connection belongs to a client for one transaction only: nothing a
        # request sets may outlive its transaction (apps/tenants/rls.py).
        "pool_mode = transaction",
        f"default_pool_size = {pool_size}",
        "min_pool_size = 0",
        "reserve_pool_size = 0",
        f"max_client_conn = {max_client_conn}",
        # Django and psycopg send nothing else at start-up; tolerate what libpq tools send.
        "ignore_startup_parameters = extra_float_digits",
        "server_reset_query =",
        "server_check_delay = 10",
        "admin_users = postgres",
        "stats_users = postgres",
    ]
    return "\n".join(lines) + "\n"


def write(
    database_url: str,
    *,
    port: int,
    directory: Path,
    pool_size: int,
    users: tuple[str, ...] = (),
    other_urls: tuple[str, ...] = (),
) -> Path:
    """pgbouncer.ini and userlist.txt in `directory`: the login of `database_url` and of each
    of `other_urls` (the web role's, say) with its password, and `users` without one."""
    directory.mkdir(parents=True, exist_ok=True)
    entries = dict.fromkeys(users, "")
    for each in (database_url, *other_urls):
        url = urlsplit(each)
        entries[unquote(url.username or "postgres")] = unquote(url.password or "")
    userlist = directory / "userlist.txt"
    userlist.write_text(
        "".join(f"{_quote_user(name)} {_quote_user(pw)}\n" for name, pw in entries.items())
    )
    userlist.chmod(0o600)
    ini = directory / "pgbouncer.ini"
    ini.write_text(render(database_url, port=port, directory=directory, pool_size=pool_size))
    return ini


def _quote_user(value: str) -> str:
    return '"' + value.replace('"', '""') + '"'


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivatePgBouncer:
    """A PgBouncer of its own (port, directory) in front of `database_url`'s server; started
    as the `postgres` system user when run as root (PgBouncer refuses to run as root)."""

    def __init__(self, database_url: str, *, pool_size: int, users: tuple[str, ...]) -> None:
        if not os.path.exists(BINARY):
            raise RuntimeError(f"{BINARY} is missing: `make pgbouncer` installs Debian's package")
        self.database_url = database_url
        self.pool_size = pool_size
        self.users = users
        self.port = _free_port()
        # Outside root's home and pytest's 0700 temp dirs: the `postgres` user must reach it.
        self.dir = Path(tempfile.mkdtemp(prefix="tick-pgbouncer-", dir="/tmp"))  # noqa: S108
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        ini = write(
            self.database_url,
            port=self.port,
            directory=self.dir,
            pool_size=self.pool_size,
            users=self.users,
        )
        if self.as_user:
            for path in (self.dir, *self.dir.iterdir()):
                shutil.chown(path, "postgres", "postgres")
        self.process = subprocess.Popen(  # noqa: S603 - a fixed binary, our own arguments
            [*self.as_user, BINARY, "--quiet", str(ini)],
            cwd=self.dir,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if self.process.poll() is not None:
                    break
                time.sleep(0.05)
        log = self.dir / "pgbouncer.log"
        raise RuntimeError(f"PgBouncer did not start: {log.read_text() if log.exists() else ''}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # immediate shutdown
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def django_through_pgbouncer(pool_size: int) -> Iterator[PrivatePgBouncer]:
    """Tests: every connection of Django's default database (each thread's) reaches the same
    server through a private PgBouncer in transaction mode while this lasts."""
    from django.db import connection, connections

    settings_dict = connection.settings_dict
    url = (
        f"postgres://{settings_dict['USER']}@{settings_dict['HOST'] or '127.0.0.1'}:"
        f"{settings_dict['PORT'] or 5432}/{settings_dict['NAME']}"
    )
    bouncer = PrivatePgBouncer(url, pool_size=pool_size, users=("tick_web",))
    bouncer.start()
    keys = ("HOST", "PORT", "DISABLE_SERVER_SIDE_CURSORS", "OPTIONS")
    saved = {key: settings_dict.get(key) for key in keys}
    connections.close_all()
    # Threads' connections share this dict (Django's ConnectionHandler hands it to each).
    # What DATABASE_POOLER=transaction sets (tickweb/settings.py): no server-side cursors and
    # no prepared statements.
    settings_dict.update(
        HOST="127.0.0.1", PORT=str(bouncer.port), DISABLE_SERVER_SIDE_CURSORS=True,
        OPTIONS={**(saved["OPTIONS"] or {}), "prepare_threshold": None},
    )  # fmt: skip
    try:
        yield bouncer
    finally:
        connections.close_all()
        settings_dict.update(saved)
        bouncer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", ""))
    parser.add_argument(
        "--also-url", action="append", default=[], help="another login's URL (the web role's)"
    )
    parser.add_argument("--port", type=int, default=6432)
    parser.add_argument("--dir", type=Path, default=Path(".run/pgbouncer"))
    parser.add_argument("--pool-size", type=int, default=20)
    args = parser.parse_args()
    ini = write(
        args.database_url,
        port=args.port,
        directory=args.dir.resolve(),
        pool_size=args.pool_size,
        other_urls=tuple(args.also_url),
    )
    os.execv(BINARY, [BINARY, str(ini)])  # noqa: S606 - a fixed binary, our own arguments


if __name__ == "__main__":
    main()
